"""reach (`applier verify --size WxH`): every cap below the canvas, on ComfyUI-shaped trees (tests/fixtures)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from applier.catalog import load_catalog
from applier.cli import cli
from applier.errors import EXIT_USAGE, EXIT_VERIFY_FAILED
from applier.resources import load_verify
from applier.store.applied import State
from applier.target import Target
from tests.fixtures.comfy_tree import build_comfy_tree

verify = load_verify()
Outcome = verify.Outcome
PATCHES = ("comfyui/max-resolution", "comfyui/pil-pixel-limit")
BIG = (32768, 18432)

# Tiled VAE nodes as nodes.py holds them (written here: tile inputs with a literal max, the canvas as a LATENT)
TILED = '''

class VAEDecodeTiled:
    @classmethod
    def INPUT_TYPES(s):
        return {"required": {"samples": ("LATENT", ), "vae": ("VAE", ),
                             "tile_size": ("INT", {"default": 512, "min": 64, "max": 4096, "step": 32})}}
'''
PIL_IMAGE = "MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)\n"


def tree(tmp_path: Path, *, patched: bool = False) -> Path:
    root = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    nodes = root / "nodes.py"
    text = nodes.read_text()
    at = text.index("\n\n\nNODE_CLASS_MAPPINGS")
    nodes.write_text(text[:at] + TILED + text[at:])
    if patched:
        args = ["apply", "--target", str(root), "--json"] + [w for p in PATCHES for w in ("--only", p)]
        done = CliRunner().invoke(cli, args, env={"APPLIER_NO_GPU_PROBE": "1"})
        assert done.exit_code == 0, done.output
    return root


def target(root: Path, site: Path | None) -> Target:
    return Target(root=root, layout="plain", comfyui_root=root, comfyui_version="0.33.0",
                  comfyui_version_source="comfyui_version.py", comfyui_commit=None, python=None,
                  python_source="none", python_version=None, site_packages=site, torch_version=None,
                  torch_cuda=None, triton_version=None)


def site_with_pillow(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    (site / "PIL").mkdir(parents=True)
    (site / "PIL" / "Image.py").write_text(PIL_IMAGE)
    return site


def reach(root: Path, size, site: Path | None = None):
    options = verify.VerifyOptions(target=target(root, site), catalog=load_catalog(), state=State(),
                                   only=("reach",), size=size)
    (result,) = verify.run_verify(options)
    return result


def test_a_stock_tree_fails_at_max_resolution_and_pillow_naming_the_nodes_and_lines(tmp_path):
    root = tree(tmp_path)
    result = reach(root, BIG, site_with_pillow(tmp_path))
    assert result.outcome is Outcome.FAIL
    assert "MAX_RESOLUTION 16384 (nodes.py:" in result.reason and "EmptyLatentImage (nodes.py:" in result.reason
    assert "applier apply --only comfyui/max-resolution" in result.reason
    assert "LoadImage (nodes.py:" in result.reason and "applier apply --only comfyui/pil-pixel-limit" in result.reason
    assert any(n.startswith("EmptyLatentImage (nodes.py:") for n in result.numbers["core_nodes"])
    assert result.numbers["pillow_where"] == "PIL/Image.py in the target's site-packages"


def test_after_apply_only_the_hard_coded_caps_remain_each_with_its_node_and_line(tmp_path):
    root = tree(tmp_path, patched=True)
    result = reach(root, BIG, site_with_pillow(tmp_path))
    assert result.outcome is Outcome.WARN
    caps = result.numbers["node_caps"]
    assert any(c.startswith("comfy_extras/nodes_load_3d.py:") and " Load3D width 4096" in c for c in caps)
    assert any(c.startswith("custom_nodes/SomePack/__init__.py:") and "MAX_RESOLUTION 16384" in c for c in caps)
    assert result.numbers["pillow_where"] == "raised in nodes.py"
    # the tiled VAE node's tile bound is listed, never a finding
    assert [t for t in result.numbers["tile_inputs"] if "VAEDecodeTiled tile_size max 4096" in t]
    assert "MAX_RESOLUTION" not in result.reason.split(":")[0]


def test_a_canvas_below_every_cap_passes(tmp_path):
    root = tree(tmp_path)
    result = reach(root, (1024, 1024), site_with_pillow(tmp_path))
    assert result.outcome is Outcome.PASS, result.reason
    assert result.numbers["node_caps"] == []


def test_a_height_cap_is_held_against_the_height_and_a_width_cap_against_the_width(tmp_path):
    root = tree(tmp_path, patched=True)
    pack = root / "custom_nodes" / "Wide"
    pack.mkdir()
    (pack / "__init__.py").write_text(
        'class WideNode:\n    @classmethod\n    def INPUT_TYPES(s):\n'
        '        return {"required": {"width": ("INT", {"max": 20000}), "height": ("INT", {"max": 20000})}}\n')
    caps = reach(root, BIG, site_with_pillow(tmp_path)).numbers["node_caps"]
    assert [c for c in caps if "WideNode width 20000" in c]
    assert not [c for c in caps if "WideNode height" in c]


def test_without_pillow_in_the_environment_the_default_is_assumed_and_said(tmp_path):
    root = tree(tmp_path)
    result = reach(root, (1024, 1024))
    assert result.outcome is Outcome.WARN and "default bound assumed" in result.reason


def test_reach_runs_only_with_a_size_and_skips_when_asked_for_without_one(tmp_path):
    root = tree(tmp_path)
    options = verify.VerifyOptions(target=target(root, None), catalog=load_catalog(), state=State())
    assert "reach" not in [i.name for i in verify.plan_checks(options)]
    assert reach(root, None).outcome is Outcome.SKIP


def test_the_cli_takes_size_and_refuses_a_malformed_one(tmp_path):
    root = tree(tmp_path)
    runner = CliRunner()
    env = {"APPLIER_NO_GPU_PROBE": "1"}
    bad = runner.invoke(cli, ["verify", "--target", str(root), "--size", "32768x"], env=env)
    assert bad.exit_code == EXIT_USAGE and "--size" in bad.output
    done = runner.invoke(cli, ["verify", "--target", str(root), "--size", "32768x18432", "--only", "reach", "--json"],
                         env=env)
    assert done.exit_code == EXIT_VERIFY_FAILED, done.output
    (check,) = [c for c in json.loads(done.output)["checks"] if c["name"] == "reach"]
    assert check["outcome"] == "FAIL" and check["numbers"]["size"] == "32768x18432"


@pytest.mark.parametrize("size", [(16384, 16384), (16385, 512)])
def test_max_resolution_fails_only_past_it(tmp_path, size):
    root = tree(tmp_path)
    result = reach(root, size, site_with_pillow(tmp_path))
    assert ("MAX_RESOLUTION 16384" in result.reason) is (max(size) > 16384)
