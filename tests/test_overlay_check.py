"""`applier overlay check`: which overlay variant a ComfyUI tree's code matches, read statically, without torch.

The trees are ComfyUI-shaped sources written here (not ComfyUI's code) for two eras: "0.3" (the block forwards the
overlay's variants follow, RMSNorm with `scale`, apply_rope1 a plain def) and "2026" (attention patches in the
forwards, `RMSNorm = None` in layers.py with the norm built from `operations`, apply_rope1 bound to comfy-kitchen
under try/except). Their fingerprints go into a variants.json of the test's own, as a maintainer records a release.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from applier.errors import BadTargetError, RefusedError
from applier.pack import check as overlay_check
from tests.shelltools import REPO, cli_json, run_cli

LAYERS_03 = '''
from .math import attention


class RMSNorm:
    def forward(self, x):
        return rms_norm(x, self.scale, 1e-6)


class QKNorm:
    def forward(self, q, k, v):
        return self.query_norm(q).to(v), self.key_norm(k).to(v)


class Modulation:
    def forward(self, vec):
        return self.lin(vec)


def apply_mod(tensor, m_mult, m_add=None, modulation_dims=None):
    return tensor * m_mult if m_add is None else m_add + tensor * m_mult


class DoubleStreamBlock:
    def forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None, modulation_dims_txt=None,
                transformer_options={}):
        return attention(img, txt, vec, pe), txt


class SingleStreamBlock:
    def forward(self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={}):
        return attention(x, x, x, pe)
'''
LAYERS_2026 = LAYERS_03.replace("class RMSNorm:\n    def forward(self, x):\n        return rms_norm(x, self.scale, "
                                "1e-6)\n", "RMSNorm = None\n").replace(
    "        return attention(img, txt, vec, pe), txt",
    "        for p in transformer_options.get('patches', {}).get('attn1_patch', []):\n"
    "            img = p(img)\n        return attention(img, txt, vec, pe), txt")
MATH_03 = '''
def attention(q, k, v, pe, mask=None, transformer_options={}):
    """Rope inline, then attention."""
    return q


def apply_rope1(x, freqs_cis):
    return x
'''
MATH_2026 = '''
import comfy.quant_ops


def attention(q, k, v, pe, mask=None, transformer_options={}):
    return apply_rope(q, k, pe)[0]


def _apply_rope1(x, freqs_cis):
    return x


def apply_rope(xq, xk, freqs_cis):
    return comfy.quant_ops.ck.apply_rope(xq, xk, freqs_cis)


def apply_rope1(x, freqs_cis):
    return comfy.quant_ops.ck.apply_rope1(x, freqs_cis)
'''
WAN = '''
from comfy.ldm.flux.math import apply_rope1


def repeat_e(e, x):
    return e


class WanSelfAttention:
    def forward(self, x, freqs, transformer_options={}):
        return apply_rope1(x, freqs)


class WanAttentionBlock:
    def forward(self, x, e, freqs, context, context_img_len=257, transformer_options={}):
        return x@@EXTRA@@
'''
OPS = '''
class disable_weight_init:
    class Linear:
        def forward(self, *args, **kwargs):
            return self.forward_comfy_cast_weights(*args, **kwargs)

    class RMSNorm:
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)
'''
HUNYUAN = '''
import comfy.ldm.flux.layers


class HunyuanVideo:
    def __init__(self):
        self.double_blocks = [comfy.ldm.flux.layers.DoubleStreamBlock()]
'''


def write_tree(root: Path, era: str) -> Path:
    files = {
        "comfy/__init__.py": "", "comfy/ldm/__init__.py": "", "comfy/ldm/flux/__init__.py": "",
        "comfy/model_base.py": "class BaseModel:\n    pass\n",
        "comfy/ops.py": OPS,
        "comfy/supported_models.py": "".join(f"class {name}:\n    pass\n\n\n"
                                             for name in ("Flux", "HunyuanVideo", "QwenImage")),
        "comfy/ldm/flux/layers.py": LAYERS_03 if era == "0.3" else LAYERS_2026,
        "comfy/ldm/flux/math.py": MATH_03 if era == "0.3" else MATH_2026,
        "comfy/ldm/flux/model.py": "from .layers import DoubleStreamBlock, SingleStreamBlock\n",
        "comfy/ldm/wan/model.py": WAN.replace("@@EXTRA@@", "" if era == "0.3" else ".contiguous()"),
        "comfy/ldm/hunyuan_video/model.py": HUNYUAN,
        "comfy/ldm/qwen_image/model.py": "class QwenImageTransformer2DModel:\n    pass\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "nodes.py").write_text("MAX_RESOLUTION = 16384\n")
    return root


def variants_verified_on(trees: dict[str, Path], label: str, out: Path) -> Path:
    """The pack's variants.json with only `label` verified: the block forwards and the Linear seam as the "0.3"
    tree has them, the RoPE seam as the "2026" tree has it."""
    data = json.loads((REPO / "overlays" / "fused_dit" / "variants.json").read_text())
    old, new = (overlay_check.check_tree(trees[era]) for era in ("0.3", "2026"))
    prints = {"linear_fp8_seam": old["seams"]["linear_fp8_seam"]["code"],
              "rope_ck_seam": new["seams"]["rope_ck_seam"]["code"]}
    for model in old["models"]:
        prints.update({name: v["code"] for name, v in model.get("variants", {}).items()
                       if model["model"] in ("Flux", "Wan 2.1")})
    for name, spec in data["variants"].items():
        spec["verified_on"] = {label: {k: v["sha256"] for k, v in prints[name].items()}}
    out.write_text(json.dumps(data))
    return out


@pytest.fixture
def verified(tmp_path):
    trees = {era: write_tree(tmp_path / era, era) for era in ("0.3", "2026")}
    return variants_verified_on(trees, "fixture", tmp_path / "variants.json")


def families(report: dict, model: str, attention: bool = False) -> dict:
    """{op family: verdict} of one model; the attention family only when asked (it reads no code of the model's)."""
    found = next(m for m in report["models"] if m["model"] == model)["families"]
    return found if attention else {name: v for name, v in found.items() if name != overlay_check.ATTENTION}


def test_a_tree_with_the_verified_code_runs_every_variant(tmp_path, verified):
    report = overlay_check.check_tree(write_tree(tmp_path / "again", "0.3"), variants_file=verified)
    for model in ("Flux", "HunyuanVideo", "Wan 2.1"):
        assert {f: v["matched"] for f, v in families(report, model).items()} == dict.fromkeys(
            overlay_check.FAMILIES, "fixture"), model
    assert overlay_check.speeds_up(report)["Qwen-Image"] == []


def test_a_seam_off_by_default_is_reported_as_not_running_unless_switched_on(tmp_path, verified, monkeypatch):
    tree = write_tree(tmp_path / "new", "2026")
    monkeypatch.delenv("FUSED_DIT_SEAMS", raising=False)
    rope = families(overlay_check.check_tree(tree, variants_file=verified), "Flux")["norm_rope"]
    assert rope["matched"] is None
    assert "code matches ComfyUI fixture, but off by default: exact (the eager chain's bits) but slower" in \
        rope["reason"]
    monkeypatch.setenv("FUSED_DIT_SEAMS", "rope_ck_seam")
    assert families(overlay_check.check_tree(tree, variants_file=verified), "Flux")["norm_rope"]["matched"] == \
        "fixture"


def test_a_2026_tree_runs_the_rope_seam_and_leaves_the_rest_stock_naming_why(tmp_path, verified, monkeypatch):
    monkeypatch.setenv("FUSED_DIT_SEAMS", "rope_ck_seam")
    report = overlay_check.check_tree(write_tree(tmp_path / "new", "2026"), variants_file=verified)
    flux = families(report, "Flux")
    assert flux["fp8_linear"]["matched"] == "fixture"                 # the Linear op did not change
    assert flux["norm_rope"] == {"variant": "rope_ck_seam", "matched": "fixture", "runs": True,
                                 "reason": "code matches ComfyUI fixture as verified",
                                 "short": "rope_ck_seam (verified on fixture)", "label": "fused QK RMSNorm + RoPE",
                                 "says": "runs for RoPE alone (ComfyUI fixture's apply_rope code); the QK RMSNorm "
                                         "stays ComfyUI's"}
    assert families(report, "Wan 2.1")["norm_rope"]["variant"] == "rope_ck_seam"
    adaln = flux["adaln"]
    assert adaln["matched"] is None and "no op seam serves this family" in adaln["reason"]
    assert adaln["short"] == "flux_block_forward_0.3: verified on fixture, this code differs"
    assert adaln["says"] == "stays ComfyUI's own: written for ComfyUI fixture's Flux blocks, this tree's differ"
    assert "differing: {blocks}:DoubleStreamBlock.forward, {blocks}:RMSNorm.forward, {blocks}:attention" in \
        adaln["reason"]
    assert "RMSNorm is bound by Assign, not by one def/class" in adaln["reason"]
    wan = families(report, "Wan 2.1")["gate"]
    assert wan["matched"] is None and "WanAttentionBlock.forward" in wan["reason"]


def test_a_tree_without_the_seams_functions_says_which_is_missing(tmp_path, verified):
    report = overlay_check.check_tree(write_tree(tmp_path / "old", "0.3"), variants_file=verified)
    rope = report["seams"]["rope_ck_seam"]
    assert rope["matched"] is None
    assert rope["code"]["comfy/ldm/flux/math.py:apply_rope"] == {"sha256": None, "at": "apply_rope is not defined"}


def test_blocks_used_as_module_attributes_are_found_in_their_file(tmp_path):
    report = overlay_check.check_tree(write_tree(tmp_path, "0.3"))
    hunyuan = next(m for m in report["models"] if m["model"] == "HunyuanVideo")
    assert hunyuan["blocks_file"] == "comfy/ldm/flux/layers.py"
    attention = hunyuan["variants"]["flux_block_forward_0.3"]["code"]["{blocks}:attention"]
    assert attention["at"] == "comfy/ldm/flux/math.py:attention"      # followed `from .math import attention`


def test_models_the_overlay_has_no_variant_for_say_so(tmp_path):
    report = overlay_check.check_tree(write_tree(tmp_path, "0.3"))
    qwen = families(report, "Qwen-Image")
    assert all(v["variant"] is None and "no variant for this model" in v["reason"] for v in qwen.values())
    assert "Flux.2" not in {m["model"] for m in report["models"]}      # supported_models has no Flux2


def test_qwen_image_2_1_is_listed_with_why_its_block_families_stay_stock(tmp_path):
    root = write_tree(tmp_path, "0.3")
    (root / "comfy/ldm/qwen_image21").mkdir(parents=True)
    (root / "comfy/ldm/qwen_image21/model.py").write_text("class QwenImage21Transformer2DModel: pass\n")
    qwen21 = families(overlay_check.check_tree(root), "Qwen-Image 2.1")
    assert all(v["variant"] is None and "comfy-kitchen" in v["reason"] for v in qwen21.values())


SDPA_ORDERS = {
    "flash first": ("SDPA_BACKEND_PRIORITY = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]\n", True,
                    "fastest_sdpa (FLASH_ATTENTION first in the release's SDPA order)"),
    "cudnn inserted first": ("SDPA_BACKEND_PRIORITY = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]\n"
                             "SDPA_BACKEND_PRIORITY.insert(0, SDPBackend.CUDNN_ATTENTION)\n", False,
                             "CUDNN_ATTENTION is first in the release's SDPA order"),
    "no order": ("", False, "no SDPA order to change"),
}


@pytest.mark.parametrize("case", list(SDPA_ORDERS))
def test_the_attention_family_runs_where_the_releases_sdpa_order_leaves_it_a_gain(tmp_path, case):
    code, runs, short = SDPA_ORDERS[case]
    tree = write_tree(tmp_path, "0.3")
    (tree / "comfy/ops.py").write_text(OPS + "\ntry:\n    if cuda:\n" + textwrap.indent(code or "pass\n", " " * 8)
                                       + "except ImportError:\n    pass\n")
    report = overlay_check.check_tree(tree)
    for model in report["models"]:           # the same verdict for every model: it reads no code of theirs
        attention = model["families"]["attention"]
        assert (attention["runs"], attention["short"]) == (runs, short), model["model"]
    assert ("see benchmarks/results/" in attention["reason"]) == bool(code)
    assert ("attention" in overlay_check.speeds_up(report)["Qwen-Image"]) == runs


def test_the_cli_says_one_line_per_family_in_words_and_the_pack_s_names_with_verbose(tmp_path):
    tree = write_tree(tmp_path / "ComfyUI", "2026")
    short = run_cli("overlay", "check", "--target", str(tree), check=True).stdout.splitlines()
    flux = short[short.index("Flux.1:") + 1:short.index("Flux.1:") + 6]
    assert [line[4:32].strip() for line in flux] == ["fused QK RMSNorm + RoPE", "fused LayerNorm + modulation",
                                                     "fused gated residual add", "FP8 Linears", "attention"]
    assert flux[1] == ("    fused LayerNorm + modulation stays ComfyUI's own: written for ComfyUI 0.3.64's Flux "
                       "blocks, this tree's differ")
    assert flux[4] == ("    attention                    stays ComfyUI's own: this release sets no order of SDPA "
                       "backends to improve on")
    assert all(len(line) <= 160 and "differing:" not in line for line in short)
    verbose = run_cli("overlay", "check", "--target", str(tree), "--verbose", check=True).stdout.splitlines()
    assert len(verbose) == len(short) + 5 * 4           # 4 models (Flux.1, HunyuanVideo, Wan 2.1, Qwen-Image)
    under = verbose[verbose.index(flux[1]) + 1]
    assert under.lstrip().startswith("adaln: stock: flux_block_forward_0.3: code differs")
    assert "differing: {blocks}:DoubleStreamBlock.forward" in under


def test_a_folder_without_comfyui_code_is_a_bad_target(tmp_path):
    with pytest.raises(BadTargetError, match="holds no ComfyUI code"):
        overlay_check.check_tree(tmp_path)


def test_the_cli_reports_json_and_exits_0_whatever_stays_stock(tmp_path):
    tree = write_tree(tmp_path / "ComfyUI", "2026")
    code, report = cli_json("overlay", "check", "--target", str(tree))
    assert code == 0
    assert {m["model"] for m in report["models"]} == {"Flux", "HunyuanVideo", "Wan 2.1", "Qwen-Image"}
    # the pack's data holds real ComfyUI fingerprints: the project's fixture code matches none of them
    assert all(not v["matched"] for m in report["models"] for v in m["families"].values())


def test_the_cli_exits_9_on_a_folder_without_comfyui(tmp_path):
    code, report = cli_json("overlay", "check", "--target", str(tmp_path))
    assert code == 9 and report["ok"] is False


def test_the_check_never_imports_torch(tmp_path):
    tree = write_tree(tmp_path, "0.3")
    script = ("import sys; sys.modules['torch'] = None\n"
              "from applier.pack.check import check_tree\n"
              f"print(len(check_tree({str(tree)!r})['models']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"


def test_an_unreadable_variants_file_is_a_refusal_not_a_traceback(tmp_path):
    broken = tmp_path / "variants.json"
    broken.write_text("{")
    with pytest.raises(RefusedError, match="variants.json is unreadable"):
        overlay_check.check_tree(write_tree(tmp_path / "t", "0.3"), variants_file=broken)
