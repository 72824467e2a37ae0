"""`applier overlay check` speaks the user's words: the model, the ComfyUI release, the kernel; never the pack's ids.

The ComfyUI-shaped trees of tests/test_overlay_check.py are dressed as the two real releases README's model table
describes: 0.3.64 (the block code the pack's block forwards copy, cuDNN first in the SDPA order, Chroma with blocks
of its own) and 0.33.0 (comfy-kitchen's RoPE, FLASH first, Flux.2, Z-Image, HunyuanImage 2.1, SD3.5, HiDream-I1 and
Kandinsky 5). A variants.json of the test's own
records their fingerprints under those releases, as a maintainer records a real one, so that each fixture tree gets
the verdicts the real tree gets. Where a real release's tree sits in the checkout (`.realcomfy/0.33.0`,
`.realcomfy/0.3.64`, never committed), README's table is held against it too.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from applier.pack import check as overlay_check
from applier.resources import load_pack_module
from tests.shelltools import REPO, run_cli
from tests.test_overlay_check import OPS, write_tree

RELEASES = {"0.3.64": "0.3", "0.33.0": "2026"}        # release -> the fixture era written for it
SDPA = {"0.3.64": "SDPA_BACKEND_PRIORITY = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]\n"
                  "SDPA_BACKEND_PRIORITY.insert(0, SDPBackend.CUDNN_ATTENTION)\n",
        "0.33.0": "SDPA_BACKEND_PRIORITY = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]\n"}
MODEL_CLASSES = {"0.3.64": ("Flux", "Chroma", "HunyuanVideo", "WAN22_T2V", "QwenImage", "Lumina2", "HunyuanImage21",
                            "SD3", "HiDream"),
                 "0.33.0": ("Flux", "Flux2", "Chroma", "HunyuanVideo", "WAN22_T2V", "QwenImage", "Lumina2", "ZImage",
                            "HunyuanImage21", "SD3", "HiDream", "Kandinsky5")}
STACK = '''
import torch.nn as nn


class {name}:
    def __init__(self, depth):
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
'''
CHROMA_LAYERS = '''
from comfy.ldm.flux.math import attention


class DoubleStreamBlock:
    def forward(self, img, txt, pe, vec, attn_mask=None):
        return attention(img, txt, vec, pe), txt
'''


def write_release_tree(root: Path, release: str) -> Path:
    """A ComfyUI-shaped tree of one of README's two releases (see the module docstring)."""
    write_tree(root, RELEASES[release])
    files = {
        "comfyui_version.py": f'__version__ = "{release}"\n',
        "comfy/ops.py": OPS + "\n" + SDPA[release],
        "comfy/supported_models.py": "".join(f"class {name}:\n    pass\n\n\n" for name in MODEL_CLASSES[release]),
        "comfy/ldm/qwen_image/model.py": STACK.format(name="QwenImageTransformer2DModel"),
        "comfy/ldm/lumina/model.py": STACK.format(name="NextDiT"),
        "comfy/ldm/modules/diffusionmodules/mmdit.py": STACK.format(name="MMDiT"),
        "comfy/ldm/hidream/model.py": STACK.format(name="HiDreamImageTransformer2DModel"),
        "comfy/ldm/kandinsky5/model.py": STACK.format(name="Kandinsky5"),
        "comfy/ldm/chroma/model.py": ("from .layers import DoubleStreamBlock\n" if release == "0.3.64" else
                                      "from comfy.ldm.flux.layers import DoubleStreamBlock\n"),
        "comfy/ldm/chroma/layers.py": CHROMA_LAYERS,
        "comfy/ldm/chroma/__init__.py": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


@pytest.fixture(autouse=True)
def as_shipped(monkeypatch):
    """The switch of the off-by-default RoPE kernel unset, as a user has it (tests/overlays/conftest.py sets it)."""
    monkeypatch.delenv("FUSED_DIT_SEAMS", raising=False)


@pytest.fixture(scope="module")
def release_trees(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("releases")
    return {release: write_release_tree(base / release / "ComfyUI", release) for release in RELEASES}


@pytest.fixture(scope="module")
def release_variants(release_trees, tmp_path_factory) -> Path:
    """The pack's variants.json with the fixture trees' fingerprints recorded as 0.3.64's and 0.33.0's: the block
    forwards as Flux's and Wan 2.1's blocks are in 0.3.64, the Linear op in both, the RoPE functions in 0.33.0."""
    data = json.loads((REPO / "overlays" / "fused_dit" / "variants.json").read_text())
    old, new = (overlay_check.check_tree(release_trees[release]) for release in RELEASES)
    prints = {"linear_fp8_seam": {"0.3.64": old["seams"]["linear_fp8_seam"]["code"],
                                  "0.33.0": new["seams"]["linear_fp8_seam"]["code"]},
              "rope_ck_seam": {"0.33.0": new["seams"]["rope_ck_seam"]["code"]}}
    for model in old["models"]:
        if model["model"] in ("Flux", "Wan 2.1"):
            prints.update({name: {"0.3.64": v["code"]} for name, v in model["variants"].items()})
    for name, spec in data["variants"].items():
        spec["verified_on"] = {release: {k: v["sha256"] for k, v in code.items()}
                               for release, code in prints[name].items()}
    out = tmp_path_factory.mktemp("variants") / "variants.json"
    out.write_text(json.dumps(data))
    return out


def printed(tree: Path, release: str, variants: Path | None = None, verbose: bool = False) -> list[str]:
    return overlay_check.report_lines(overlay_check.check_tree(tree, release, variants_file=variants), verbose)


def internal_ids() -> set[str]:
    """The pack's own names, which the default output must not hold: its variants and implementations, the op
    families' keys that no user writes (those with an underscore), its switch, and the dependency keys' marker."""
    families = load_pack_module("families")
    variants = json.loads((REPO / "overlays" / "fused_dit" / "variants.json").read_text())["variants"]
    implementations = {impl.name for family in families.FAMILIES.values() for impl in family.implementations}
    return ({*variants, *implementations, "FUSED_DIT_SEAMS", "{blocks}"}
            | {name for name in families.FAMILIES if "_" in name})


ID_WORDS = re.compile(r"\b(era|eras|seam|seams|variant|variants)\b", re.IGNORECASE)


def ids_in(lines: list[str]) -> list[str]:
    ids = internal_ids()
    return [line for line in lines if ID_WORDS.search(line) or any(name in line for name in ids)]


def test_the_set_of_internal_ids_is_the_pack_s_names():
    ids = internal_ids()
    assert {"flux_block_forward_0.3", "wan_block_forward_0.3", "linear_fp8_seam", "rope_ck_seam", "fastest_sdpa",
            "fp8_attention", "norm_rope", "fp8_linear"} <= ids
    assert ids_in(["    fp8_linear runs linear_fp8_seam (verified on 0.33.0)",
                   "flux_block_forward_0.3: verified on 0.3.64, this code differs"]) != []
    assert ids_in(["RoPE: the era's seam"]) != [] and ids_in(["FLASH_ATTENTION first; seamless"]) == []


@pytest.mark.parametrize("release", list(RELEASES))
def test_the_default_output_holds_no_internal_id(release, release_trees, release_variants):
    lines = printed(release_trees[release], release, release_variants)
    assert any(line.endswith(" on ComfyUI " + release + ":") for line in lines)
    assert ids_in(lines) == []
    assert all(len(line) <= 160 for line in lines)
    # the pack's own names stay reachable: under each line with --verbose
    assert ids_in(printed(release_trees[release], release, release_variants, verbose=True)) != []


@pytest.mark.parametrize("release", list(RELEASES))
def test_the_cli_s_default_output_holds_no_internal_id(release, release_trees):
    """The whole command, install lines included, with the pack's own variants.json (nothing of the fixture code
    matches a real release's, so every line says why it stays ComfyUI's own)."""
    out = run_cli("overlay", "check", "--target", str(release_trees[release]), check=True).stdout.splitlines()
    assert f"Flux.1 on ComfyUI {release}:" in out
    assert ids_in(out) == []
    verbose = run_cli("overlay", "check", "--target", str(release_trees[release]), "-v", check=True).stdout
    assert "flux_block_forward_0.3" in verbose


def test_fp8_reaches_a_model_without_known_blocks_through_its_stack_of_blocks(tmp_path, release_variants):
    tree = write_release_tree(tmp_path / "ComfyUI", "0.33.0")
    qwen = next(m for m in overlay_check.check_tree(tree, "0.33.0", variants_file=release_variants)["models"]
                if m["model"] == "Qwen-Image")["families"]
    assert qwen["fp8_linear"]["runs"] and qwen["fp8_linear"]["variant"] == "linear_fp8_seam"
    assert qwen["fp8_linear"]["says"].startswith("runs, through ComfyUI's Linear ops in its blocks")
    assert not any(qwen[name]["runs"] for name in ("norm_rope", "adaln", "gate"))
    (tree / "comfy/ldm/qwen_image/model.py").write_text("class QwenImageTransformer2DModel:\n    pass\n")
    qwen = next(m for m in overlay_check.check_tree(tree, "0.33.0", variants_file=release_variants)["models"]
                if m["model"] == "Qwen-Image")["families"]
    assert not qwen["fp8_linear"]["runs"]
    assert qwen["fp8_linear"]["says"] == ("stays ComfyUI's own: comfy/ldm/qwen_image/model.py builds no stack of "
                                          "blocks for FP8 to reach")


# ---------------------------------------------------------------------------------------- README's model table
def readme_table() -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """{(release, model): (what runs, what stays ComfyUI's own)} of README's model table: each cell's op families
    are the labels `overlay check` prints, comma-separated, before the first ': '."""
    text = (REPO / "README.md").read_text()
    header = "| ComfyUI | model | runs | stays ComfyUI's own |"
    assert header in text, "README has no model table"
    rows = {}
    for line in text[text.index(header):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        release, models, runs, stock = (cell.strip() for cell in line.strip("|").split("|"))

        def labels(cell: str) -> set[str]:
            return {label.strip() for label in cell.split(": ")[0].split(",") if label.strip()}
        for model in models.split(", "):
            rows[(release, model)] = (labels(runs), labels(stock))
    return rows


def printed_table(lines: list[str], release: str) -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """The same shape read back from `overlay check`'s printed lines."""
    rows, model = {}, None
    width = overlay_check.LABEL_WIDTH
    for line in lines[1:]:
        if not line.startswith(" "):
            model = line.removesuffix(":").removesuffix(f" on ComfyUI {release}")
            rows[(release, model)] = (set(), set())
        else:
            label, says = line[4:4 + width].strip(), line[4 + width + 1:]
            rows[(release, model)][0 if says.startswith(overlay_check.RUNS) else 1].add(label)
    return rows


def test_readme_s_model_table_is_what_overlay_check_prints(release_trees, release_variants):
    table = readme_table()
    for release in RELEASES:
        got = printed_table(printed(release_trees[release], release, release_variants), release)
        assert {key: table.get(key) for key in got} == got, release
        assert {key for key in table if key[0] == release} == set(got), release


def real_tree(release: str) -> Path:
    return REPO / ".realcomfy" / release


@pytest.mark.parametrize("release", list(RELEASES))
def test_readme_s_model_table_is_what_overlay_check_prints_on_a_real_tree(release):
    """A real release's tree at .realcomfy/<release> (a local checkout, never committed), where one sits."""
    if not (real_tree(release) / "comfy" / "ops.py").is_file():
        pytest.skip(f"no real ComfyUI {release} tree at .realcomfy/{release}")
    lines = printed(real_tree(release), release)
    assert ids_in(lines) == [] and all(len(line) <= 160 for line in lines)
    table = readme_table()
    got = printed_table(lines, release)
    assert {key: table.get(key) for key in got} == got
    assert {key for key in table if key[0] == release} == set(got)


def test_fp8_on_a_model_it_was_not_timed_on_says_which_models_it_was_timed_on(release_trees, release_variants):
    lines = printed(release_trees["0.33.0"], "0.33.0", release_variants)
    fp8, model = {}, None
    for line in lines[1:]:
        if not line.startswith(" "):
            model = line.split(" on ComfyUI")[0]
        elif line.strip().startswith("FP8 Linears"):
            fp8[model] = line
    assert fp8["Qwen-Image"].endswith("; faster from 2048 px, slower at 1024 px")
    assert fp8["Z-Image"].endswith("; faster from 2048 px (1024 untimed)")
    assert fp8["Lumina 2"].endswith("; timed on Qwen-Image and Z-Image only")
