"""max-resolution (nodes.py read statically) and resolution-caps (hard-coded caps in extras and custom nodes)."""
from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from applier.catalog import load_catalog
from applier.resources import load_verify
from applier.store.applied import AppliedFile, AppliedPatch, State
from applier.target import Target

verify = load_verify()
resolution = importlib.import_module("applier_verify.checks.resolution")
Outcome = verify.Outcome

PATCHED = 40960
STOCK = 16384

NODES_PY = """\
import torch

MAX_RESOLUTION = {value}

class EmptyLatentImage:
    @classmethod
    def INPUT_TYPES(s):
        return {{"required": {{"width": ("INT", {{"default": 512, "min": 16, "max": MAX_RESOLUTION, "step": 8}})}}}}
"""


def write_nodes_py(root: Path, value: int, *, crlf: bool = False, bom: bool = False, text: str | None = None) -> Path:
    source = text if text is not None else NODES_PY.format(value=value)
    if crlf:
        source = source.replace("\n", "\r\n")
    data = source.encode("utf-8")
    if bom:
        data = b"\xef\xbb\xbf" + data
    root.mkdir(parents=True, exist_ok=True)
    (root / "nodes.py").write_bytes(data)
    return root / "nodes.py"


def make_catalog(tmp_path: Path) -> list:
    """A one-patch catalog whose diff raises MAX_RESOLUTION to 40960, like the real comfyui/max-resolution."""
    folder = tmp_path / "catalog" / "comfyui" / "max-resolution"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(textwrap.dedent("""\
        title = "Raise MAX_RESOLUTION"
        effect_probe = "comfy_import"
        [[variant]]
        name = "all"
        versions = ">=0"
        diff = "nodes.diff"
    """))
    (folder / "nodes.diff").write_text(textwrap.dedent(f"""\
        --- a/nodes.py
        +++ b/nodes.py
        @@ -3 +3 @@
        -MAX_RESOLUTION = {STOCK}
        +MAX_RESOLUTION = {PATCHED}
    """))
    return load_catalog(tmp_path / "catalog")


def make_target(comfyui_root: Path | None, python: Path | None = None) -> Target:
    return Target(root=comfyui_root or Path("/nonexistent"), layout="plain", comfyui_root=comfyui_root,
                  comfyui_version="0.3.64", comfyui_version_source="comfyui_version.py", comfyui_commit=None,
                  python=python, python_source="none" if python is None else "--python", python_version=None,
                  site_packages=None, torch_version=None, torch_cuda=None, triton_version=None)


def applied_state(comfyui_root: Path) -> State:
    record = AppliedPatch(id="comfyui/max-resolution", variant="all", component="comfyui",
                          files=[AppliedFile(relpath="nodes.py",
                                             sha256_before=None, sha256_after=None)],
                          component_version="0.3.64", applied_at="2026-11-30T00:00:00Z")
    return State({record.id: record})


def run(target, catalog, state=None, **options):
    opts = verify.VerifyOptions(target=target, catalog=catalog, state=state or State(),
                                only=options.pop("only", ("max-resolution", "resolution-caps")), **options)
    return {r.name: r for r in verify.run_verify(opts)}


# ------------------------------------------------------------------ reading nodes.py

@pytest.mark.parametrize("line", [
    "MAX_RESOLUTION = 16384", "MAX_RESOLUTION=16384", "MAX_RESOLUTION: int = 16384", "MAX_RESOLUTION = 8192 * 2",
    "MAX_RESOLUTION = 1 << 14",
])
def test_reads_max_resolution_in_every_spelling(tmp_path, line):
    nodes = write_nodes_py(tmp_path, 0, text=f"import os\n{line}  # the cap\n")
    found = resolution.read_max_resolution(nodes)
    assert (found.value, found.line, found.how) == (STOCK, 2, "ast")


@pytest.mark.parametrize("crlf, bom", [(True, False), (False, True), (True, True)])
def test_reads_max_resolution_through_crlf_and_bom(tmp_path, crlf, bom):
    nodes = write_nodes_py(tmp_path, PATCHED, crlf=crlf, bom=bom)
    found = resolution.read_max_resolution(nodes)
    assert (found.value, found.line) == (PATCHED, 3)


def test_last_module_level_assignment_wins_and_nested_ones_do_not_count(tmp_path):
    nodes = write_nodes_py(tmp_path, 0, text=textwrap.dedent("""\
        MAX_RESOLUTION = 8192
        def f():
            MAX_RESOLUTION = 4
        MAX_RESOLUTION = 16384
    """))
    assert resolution.read_max_resolution(nodes).value == STOCK


def test_unparsable_nodes_py_falls_back_to_a_line_match(tmp_path):
    nodes = write_nodes_py(tmp_path, 0, text="print 'python 2 syntax'\nMAX_RESOLUTION = 40960\n")
    found = resolution.read_max_resolution(nodes)
    assert (found.value, found.line, found.how) == (PATCHED, 2, "regex")


# ------------------------------------------------------------------ the max-resolution check

@pytest.mark.parametrize("value", [8192, STOCK])
def test_a_tree_without_the_patch_warns_with_the_value_it_found_and_says_the_patch_is_not_applied(tmp_path, value):
    # The stock value read from nodes.py proves nothing about the patch: never a PASS.
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, value)
    result = run(make_target(root), make_catalog(tmp_path))["max-resolution"]
    assert result.outcome is Outcome.WARN
    assert result.reason.startswith("not patched")
    assert "comfyui/max-resolution is not applied" in result.reason
    assert f"MAX_RESOLUTION = {value} (nodes.py:3)" in result.reason
    assert result.numbers["nodes_py"] == value and result.numbers["applied"] is False


def test_a_tree_that_holds_the_patched_value_without_the_state_record_warns_too(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    result = run(make_target(root), make_catalog(tmp_path))["max-resolution"]
    assert result.outcome is Outcome.WARN
    assert "not applied" in result.reason and "holds its value" in result.reason


def test_without_a_max_resolution_patch_in_the_catalog_the_check_warns(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, STOCK)
    result = run(make_target(root), [])["max-resolution"]
    assert result.outcome is Outcome.WARN
    assert "no max-resolution patch" in result.reason and "16384" in result.reason


def test_applied_patch_with_the_patched_value_passes(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED, crlf=True)
    result = run(make_target(root), make_catalog(tmp_path), applied_state(root))["max-resolution"]
    assert result.outcome is Outcome.PASS
    assert result.numbers["patched_value"] == PATCHED and result.numbers["nodes_py"] == PATCHED


def test_applied_state_with_a_stock_tree_fails(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, STOCK)
    result = run(make_target(root), make_catalog(tmp_path), applied_state(root))["max-resolution"]
    assert result.outcome is Outcome.FAIL
    assert "40960" in result.reason and "16384" in result.reason


def test_target_without_comfyui_skips(tmp_path):
    results = run(make_target(None), make_catalog(tmp_path))
    assert results["max-resolution"].outcome is Outcome.SKIP
    assert results["resolution-caps"].outcome is Outcome.SKIP


@pytest.mark.skipif(sys.platform == "win32", reason="fake interpreter is a shell script")
def test_real_import_reports_the_width_max_the_target_sees_and_fails_on_a_mismatch(tmp_path, monkeypatch):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "comfy_import.py").write_text("# stands in for the real probe; the fake interpreter answers\n")
    monkeypatch.setattr(verify.runner, "PROBES_DIR", probes)
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    python = tmp_path / "python"
    # The import says 16384 although the file says 40960: something shadows nodes.py in the target.
    python.write_text("#!/bin/sh\necho '{\"outcome\": \"FAIL\", \"reason\": \"width max 16384\", "
                      "\"numbers\": {\"max_resolution\": 16384, \"empty_latent_width_max\": 16384}}'\n")
    python.chmod(0o755)
    result = run(make_target(root, python), make_catalog(tmp_path), applied_state(root),
                 real_import=True)["max-resolution"]
    assert result.outcome is Outcome.FAIL
    assert result.numbers["empty_latent_width_max"] == STOCK
    assert "expected 40960" in result.reason


# ------------------------------------------------------------------ resolution-caps

CUSTOM_NODE = """\
import nodes

MAX_RESOLUTION = 16384


class Resize:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "width": ("INT", {"default": 1024, "min": 64, "max": 8192, "step": 8}),
            "height": ("INT", {"default": 1024, "min": 64, "max": MAX_RESOLUTION}),
            "line_width": ("INT", {"default": 2, "max": 32}),
            "steps": ("INT", {"default": 20, "max": 4096}),
        }}


def schema(io):
    return io.Int.Input("resolution", default=1024, min=64, max=4096)
"""


def build_tree(root: Path) -> None:
    write_nodes_py(root, PATCHED)
    pack = root / "custom_nodes" / "resize-pack"
    pack.mkdir(parents=True)
    (pack / "nodes.py").write_text(CUSTOM_NODE)
    # The same cap in a node's own venv, in bytecode caches and in applier's state folder is not the node's code.
    for ignored in ("venv/lib/site.py", "__pycache__/nodes.py", ".git/hooks/x.py"):
        path = pack / ignored
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("MAX_RESOLUTION = 8192\n")
    other_env = pack / "runtime"
    other_env.mkdir()
    (other_env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other_env / "cap.py").write_text("MAX_RESOLUTION = 8192\n")
    extras = root / "comfy_extras"
    extras.mkdir()
    (extras / "nodes_load_3d.py").write_text('INPUTS = {"width": ("INT", {"default": 1024, "max": 4096})}\n')
    (extras / "nodes_images.py").write_text("import nodes\nMAX_RESOLUTION = nodes.MAX_RESOLUTION\n")
    broken = root / "custom_nodes" / "old-pack"
    broken.mkdir()
    # the statement that holds the cap does not parse (only those that can hold one are parsed): read by lines
    (broken / "legacy.py").write_text('class Old:\n    print "py2"\n    MAX_RESOLUTION = 8192\n')


def test_caps_are_reported_as_file_line_value_and_only_below_the_patched_cap(tmp_path):
    root = tmp_path / "ComfyUI"
    build_tree(root)
    result = run(make_target(root), make_catalog(tmp_path), applied_state(root))["resolution-caps"]
    assert result.outcome is Outcome.WARN
    assert result.numbers["cap"] == PATCHED
    assert sorted(result.numbers["caps"]) == sorted([
        "comfy_extras/nodes_load_3d.py:1:4096",
        "custom_nodes/old-pack/legacy.py:3:8192",          # found by the line-match fallback
        "custom_nodes/resize-pack/nodes.py:3:16384",
        "custom_nodes/resize-pack/nodes.py:10:8192",
        "custom_nodes/resize-pack/nodes.py:18:4096",
    ])
    assert result.numbers["files_read_by_regex"] == 1
    assert "custom_nodes/resize-pack/nodes.py:3:16384" in result.reason or "more" in result.reason


def test_caps_warn_even_when_the_patch_is_not_applied_and_say_so(tmp_path):
    root = tmp_path / "ComfyUI"
    build_tree(root)
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.outcome is Outcome.WARN
    assert "not applied" in result.reason


def test_tree_without_caps_passes(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    (root / "custom_nodes" / "clean").mkdir(parents=True)
    (root / "custom_nodes" / "clean" / "n.py").write_text(
        'import nodes\nX = {"width": ("INT", {"max": nodes.MAX_RESOLUTION})}\n')
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.outcome is Outcome.PASS
    assert result.numbers["caps"] == []


def test_without_a_catalog_patch_the_cap_is_nodes_py_value(tmp_path):
    root = tmp_path / "ComfyUI"
    build_tree(root)
    write_nodes_py(root, STOCK)
    result = run(make_target(root), [])["resolution-caps"]
    assert result.numbers["cap"] == STOCK
    assert "custom_nodes/resize-pack/nodes.py:3:16384" not in result.numbers["caps"]
    assert "custom_nodes/resize-pack/nodes.py:10:8192" in result.numbers["caps"]


def test_the_real_catalog_names_the_patch_and_value_the_checks_compare_with(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, STOCK)
    options = verify.VerifyOptions(target=make_target(root), catalog=load_catalog(), state=State())
    patch, value = verify.VerifyContext(options).max_resolution_patch()
    assert (patch.id, value) == ("comfyui/max-resolution", PATCHED)


def test_a_cap_in_an_options_dict_spread_over_lines_is_reported_at_its_max_line(tmp_path):
    source = textwrap.dedent("""\
        class Upscale:
            @classmethod
            def INPUT_TYPES(cls):
                return {"required": {
                    "target_height": ("INT", {
                        "default": 1024,
                        "min": 64,
                        "max": 12288,
                    }),
                }}
        SCHEMA = Int.Input(id="tile_width", default=512, max=2048)
    """).encode()
    caps, by_regex = resolution.caps_in_source(source, "custom_nodes/up/nodes.py", PATCHED)
    assert not by_regex
    assert [(str(c), c.what) for c in caps] == [("custom_nodes/up/nodes.py:8:12288", "target_height"),
                                                 ("custom_nodes/up/nodes.py:11:2048", "tile_width")]


SERVABLE_NODES_PY = NODES_PY.replace("import torch\n", "import os\n") + \
    'NODE_CLASS_MAPPINGS = {{"EmptyLatentImage": EmptyLatentImage}}\n'


@pytest.mark.parametrize("value, applied, outcome, effect_outcome", [
    (PATCHED, True, Outcome.PASS, Outcome.PASS),
    (STOCK, False, Outcome.WARN, Outcome.PASS),   # not applied: the check warns, the effect matches the state
    (STOCK, True, Outcome.FAIL, Outcome.FAIL),
])
def test_real_import_through_the_comfy_import_probe(tmp_path, value, applied, outcome, effect_outcome):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, 0, text=SERVABLE_NODES_PY.format(value=value))
    catalog = [p for p in load_catalog() if p.id == "comfyui/max-resolution"]
    state = applied_state(root) if applied else State()
    results = run(make_target(root, Path(sys.executable)), catalog, state, real_import=True,
                  only=("max-resolution", "effect"))
    check, effect = results["max-resolution"], results["effect:comfyui/max-resolution"]
    assert check.outcome is outcome, (check.reason, check.stderr)
    assert check.numbers["empty_latent_width_max"] == value
    assert effect.outcome is effect_outcome, (effect.reason, effect.stderr)
    assert effect.numbers["empty_latent_width_max"] == value


# ------------------------------------------------------------------ what the caps scan never reads

def test_caps_scan_skips_special_oversized_and_outside_files_with_a_warn(tmp_path, hang_guard):
    import os
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    pack = root / "custom_nodes" / "pack"
    pack.mkdir(parents=True)
    os.mkfifo(pack / "fifo.py")
    (pack / "zero.py").symlink_to("/dev/zero")
    outside = tmp_path / "elsewhere.py"
    outside.write_text("MAX_RESOLUTION = 4096\n")
    (pack / "outside.py").symlink_to(outside)
    (pack / "huge.py").write_bytes(b"MAX_RESOLUTION = 2048\n" + b"#" * resolution.MAX_SCANNED_FILE_BYTES)
    inside = pack / "real.py"
    inside.write_text("MAX_RESOLUTION = 8192\n")
    (pack / "alias.py").symlink_to("real.py")                    # a link inside the tree is read
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.outcome is Outcome.WARN
    assert sorted(result.numbers["caps"]) == ["custom_nodes/pack/alias.py:1:8192", "custom_nodes/pack/real.py:1:8192"]
    skipped = dict(s.split(": ", 1) for s in result.numbers["skipped"])
    assert skipped == {"custom_nodes/pack/fifo.py": "a FIFO (named pipe), not a regular file",
                       "custom_nodes/pack/huge.py": "larger than 4 MiB",
                       "custom_nodes/pack/outside.py": "a link leading outside the ComfyUI folder",
                       "custom_nodes/pack/zero.py": "a link leading outside the ComfyUI folder"}
    assert "skipped 4 files" in result.reason


def test_a_link_to_a_device_inside_the_tree_is_skipped_too(tmp_path, hang_guard):
    import os
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    (root / "custom_nodes").mkdir()
    os.mkfifo(root / "custom_nodes" / "pipe")
    (root / "custom_nodes" / "to_pipe.py").symlink_to("pipe")
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.outcome is Outcome.WARN and "to_pipe.py (a FIFO" in result.reason


def test_only_skipped_files_and_no_cap_is_a_warn_not_a_pass(tmp_path, hang_guard):
    import os
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    (root / "comfy_extras").mkdir()
    os.mkfifo(root / "comfy_extras" / "nodes_x.py")
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.outcome is Outcome.WARN and "comfy_extras/nodes_x.py" in result.reason


def test_a_source_nested_too_deep_for_ast_is_read_by_lines(tmp_path):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    (root / "custom_nodes").mkdir()
    (root / "custom_nodes" / "deep.py").write_text("MAX_RESOLUTION = 8192\nX = 1" + "+1" * 100000 + "\n")
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.numbers["caps"] == ["custom_nodes/deep.py:1:8192"]


def test_a_fifo_nodes_py_is_a_fail_with_the_reason_not_a_hang(tmp_path, hang_guard):
    import os
    root = tmp_path / "ComfyUI"
    root.mkdir()
    os.mkfifo(root / "nodes.py")
    results = run(make_target(root), make_catalog(tmp_path))
    assert results["max-resolution"].outcome is Outcome.FAIL and "FIFO" in results["max-resolution"].reason
    assert results["resolution-caps"].outcome is not Outcome.FAIL


def test_a_nodes_py_a_link_leads_out_of_the_tree_is_not_read(tmp_path):
    root = tmp_path / "ComfyUI"
    root.mkdir()
    elsewhere = write_nodes_py(tmp_path / "another-install", PATCHED)
    (root / "nodes.py").symlink_to(elsewhere)
    results = run(make_target(root), make_catalog(tmp_path), state=applied_state(root))
    assert results["max-resolution"].outcome is Outcome.FAIL
    assert "link leading outside" in results["max-resolution"].reason
    assert str(PATCHED) not in results["max-resolution"].reason, "the other install's nodes.py was read"


@pytest.mark.parametrize("folder", ["custom_nodes", "comfy_extras"])
def test_a_scanned_folder_that_is_a_link_out_of_the_tree_is_skipped_not_walked(tmp_path, folder):
    root = tmp_path / "ComfyUI"
    write_nodes_py(root, PATCHED)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "pack").mkdir(parents=True)
    (elsewhere / "nodes_x.py").write_text("MAX_RESOLUTION = 4096\n")
    (elsewhere / "pack" / "caps.py").write_text("MAX_RESOLUTION = 2048\n")
    (root / folder).symlink_to(elsewhere, target_is_directory=True)
    result = run(make_target(root), make_catalog(tmp_path))["resolution-caps"]
    assert result.numbers["caps"] == [] and result.numbers["files_scanned"] == 0
    assert result.numbers["skipped"] == [f"{folder}/: a link leading outside the ComfyUI folder"]
    assert result.outcome is Outcome.WARN


# ---------------------------------------------------------------- the scan parses only what can hold a cap

HEADER = '''\
"""A node file.
width = {"max": 333}
"""
import nodes

MAX_RESOLUTION_HERE = nodes.MAX_RESOLUTION
if nodes:
    pass
else:
    LOCAL_MAX_RESOLUTION = (
        1 << 11)
'''
NODE_FILE = '''

@some.decorator
class Plain{n}:
    @classmethod
    def INPUT_TYPES(s):
        return {{"required": {{"width": ("INT", {{"default": 512, "max": nodes.MAX_RESOLUTION}}),
                              "strength": ("FLOAT", {{"max": 100.0}})}}
}}
'''
CAPPED = '''

class Capped:
    def define_schema(cls):
        return io.Schema(inputs=[io.Int.Input("height", default=512, max=2048),
                                 io.Int.Input("resolution", max=16 * 64)])
'''


def test_only_the_statements_that_can_hold_a_cap_are_parsed_and_the_caps_are_those_of_the_whole_file(monkeypatch):
    source = HEADER + "".join(NODE_FILE.format(n=n) for n in range(20)) + CAPPED
    whole = resolution._caps_in_tree(resolution.ast.parse(source), "x.py", 4096)
    parsed = []
    real_parse = resolution.ast.parse
    monkeypatch.setattr(resolution.ast, "parse", lambda text, *a, **kw: parsed.append(text) or real_parse(text))
    caps, by_regex = resolution.caps_in_source(source.encode(), "x.py", 4096)
    assert caps == sorted(set(whole), key=lambda c: c.line) and not by_regex
    assert [(c.what, c.value, c.node) for c in caps] == [("MAX_RESOLUTION", 2048, ""), ("height", 2048, "Capped"),
                                                          ("resolution", 1024, "Capped")]
    # the 20 node classes hold names and floats after "max", never a number: only the docstring (its text looks
    # like a cap), the if statement and the class with caps are parsed
    assert len(parsed) == 3 and sum(len(text.strip()) for text in parsed) < len(source) / 5
    assert not resolution.worth_parsing(NODE_FILE.format(n=0).encode(), 1 << 30)


def test_a_cut_that_goes_wrong_parses_the_whole_file_instead(monkeypatch):
    # a column-0 line inside a string that counting triple quotes does not see: the cut statement does not parse
    source = 'x = """\\\nclass Fake:\n    "width": {"max": 512}\n"""\nwidth = {"w": ("INT", {"max": 1024})}\n'
    caps, _ = resolution.caps_in_source(source.encode(), "x.py", 4096)
    assert caps == resolution._caps_in_tree(resolution.ast.parse(source), "x.py", 4096)


@pytest.mark.parametrize("size", [300, 1024, 4096, 1 << 30])
def test_the_quick_patterns_never_skip_a_file_the_parser_finds_a_cap_in(size):
    sources = [HEADER + NODE_FILE.format(n=1) + CAPPED, 'W = {"width": ("INT", {"max":\n    (2 ** 10)})}\n',
               "X_MAX_RESOLUTION: int = 0x400\n", 'io.Int.Input("width", max=8_192)\n']
    for source in sources:
        whole = resolution._caps_in_tree(resolution.ast.parse(source), "x.py", size)
        assert resolution.worth_parsing(source.encode(), size) or not whole, source
        if whole:
            assert resolution.caps_in_source(source.encode(), "x.py", size)[0] == sorted(set(whole),
                                                                                       key=lambda c: c.line)
