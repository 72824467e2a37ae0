"""Detection across layouts, and the whole cycle on a venv holding real torch files checked against RECORD."""
from __future__ import annotations

import hashlib
from pathlib import Path
import subprocess

import pytest

from applier.detect import detect
from applier.record import pristine_hashes
from shelltools import cli_json, make_catalog, make_comfy, make_torch_env, run_cli, write_patch


def test_git_checkout_with_version_file(tmp_path):
    comfy = make_comfy(tmp_path, version="0.3.64", git=True)
    found = detect(comfy, gpu=False)
    assert found.layout == "git-checkout"
    assert (found.comfyui_version, found.comfyui_version_source) == ("0.3.64", "comfyui_version.py")
    assert found.comfyui_commit and found.python is None
    assert any("no Python environment" in n for n in found.notes)


def test_version_from_pyproject_then_git_tag_then_unknown(tmp_path):
    comfy = make_comfy(tmp_path / "a", version=None)
    (comfy / "pyproject.toml").write_text('[project]\nname = "ComfyUI"\nversion = "0.3.12"\n')
    assert detect(comfy, gpu=False).comfyui_version == "0.3.12"
    tagged = make_comfy(tmp_path / "b", version=None, git=True)
    subprocess.run(["git", "-C", str(tagged), "tag", "v0.2.7"], check=True)
    found = detect(tagged, gpu=False)
    assert (found.comfyui_version, found.comfyui_version_source) == ("0.2.7", "git tag")
    plain = make_comfy(tmp_path / "c", version=None)
    found = detect(plain, gpu=False)
    assert (found.comfyui_version, found.comfyui_version_source, found.layout) == (None, "unknown", "plain")


def test_portable_layout(tmp_path):
    outer = tmp_path / "ComfyUI_windows_portable"
    make_comfy(outer, version="0.3.40")
    site = outer / "python_embeded" / "Lib" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.7.1+cu128'\ncuda = '12.8'\n")
    (outer / "python_embeded" / "python.exe").write_bytes(b"MZ not runnable here")
    found = detect(outer, gpu=False)
    assert found.layout == "portable" and found.comfyui_root == outer / "ComfyUI"
    assert found.python_source == "python_embeded"
    assert found.site_packages == site
    assert (found.torch_version, found.torch_cuda) == ("2.7.1+cu128", "12.8")


def test_bad_targets_exit_9(tmp_path):
    proc = run_cli("detect", "--target", str(tmp_path / "missing"))
    assert proc.returncode == 9 and "does not exist" in proc.stderr
    proc = run_cli("detect", "--target", str(tmp_path))
    assert proc.returncode == 9 and "neither ComfyUI" in proc.stderr


@pytest.fixture(scope="module")
def torch_env(tmp_path_factory):
    return make_torch_env(tmp_path_factory.mktemp("torchenv"))


def test_detect_reads_torch_without_importing_it(torch_env):
    env, site = torch_env
    code, out = cli_json("detect", "--target", str(env))
    assert code == 0, out
    assert out["layout"] == "python-env" and out["site_packages"] == str(site)
    # the copy holds no torch/__init__.py: importing torch there would fail, so detection cannot have imported it
    assert not (site / "torch" / "__init__.py").exists()
    assert out["torch_version"].startswith("2.") and "+" in out["torch_version"]


def test_bare_comfyui_takes_comfyui_patches_and_torch_is_not_applicable(tmp_path):
    comfy = make_comfy(tmp_path)
    catalog = make_catalog(tmp_path)
    write_patch(catalog, "torch/t", [("all", ">=2.0", "--- a/torch/cuda/streams.py\n+++ b/torch/cuda/streams.py\n")])
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    plans = {p["id"]: p for p in out["patches"]}
    assert plans["comfyui/maxres"]["action"] == "apply"
    assert plans["torch/t"]["action"] == "not-applicable" and "no Python environment" in plans["torch/t"]["reason"]


STREAM_DIFF_TEMPLATE = """\
--- a/torch/cuda/streams.py
+++ b/torch/cuda/streams.py
@@ -{line},1 +{line},1 @@
-    def __new__(cls, device=None, priority=0, **kwargs):
+    def __new__(cls, device=None, priority=-1, **kwargs):
"""


def test_real_torch_files_apply_status_revert_match_record(torch_env, tmp_path):
    env, site = torch_env
    streams = site / "torch" / "cuda" / "streams.py"
    lines = streams.read_text().splitlines()
    line = lines.index("    def __new__(cls, device=None, priority=0, **kwargs):") + 1
    catalog = tmp_path / "catalog"
    write_patch(catalog, "torch/prio", [("all", ">=2.4", STREAM_DIFF_TEMPLATE.format(line=line))])
    record = pristine_hashes(site)
    rel = "torch/cuda/streams.py"
    assert record[rel] == hashlib.sha256(streams.read_bytes()).hexdigest()   # the copy is pristine

    run_cli("apply", "--target", str(env), "--patches", str(catalog), check=True)
    assert "priority=-1" in streams.read_text()
    assert record[rel] != hashlib.sha256(streams.read_bytes()).hexdigest()
    code, out = cli_json("status", "--target", str(env), "--patches", str(catalog))
    assert out["patches"][0]["state"] == "applied"

    run_cli("revert", "--target", str(env), "--patches", str(catalog), check=True)
    for path in sorted((site / "torch" / "cuda").glob("*.py")):
        assert record[str(path.relative_to(site))] == hashlib.sha256(path.read_bytes()).hexdigest(), path


def test_torch_reinstall_is_reported_lost_and_reapplied(torch_env, tmp_path):
    env, site = torch_env
    streams = site / "torch" / "cuda" / "streams.py"
    pristine = streams.read_bytes()
    line = streams.read_text().splitlines().index("    def __new__(cls, device=None, priority=0, **kwargs):") + 1
    catalog = tmp_path / "catalog"
    write_patch(catalog, "torch/prio", [("all", ">=2.4", STREAM_DIFF_TEMPLATE.format(line=line))])
    run_cli("apply", "--target", str(env), "--patches", str(catalog), check=True)
    streams.write_bytes(pristine)                         # pip install --force-reinstall torch
    code, out = cli_json("status", "--target", str(env), "--patches", str(catalog))
    assert code == 5 and out["patches"][0]["state"] == "lost"
    run_cli("apply", "--target", str(env), "--patches", str(catalog), check=True)
    assert "priority=-1" in streams.read_text()
    run_cli("revert", "--target", str(env), "--patches", str(catalog), check=True)
    assert streams.read_bytes() == pristine


def test_torch_found_through_a_pth_file_outside_site_packages(tmp_path):
    import subprocess as sp
    import sys
    env = tmp_path / "venv"
    sp.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = Path(sp.run([str(env / "bin" / "python"), "-I", "-c",
                        "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                       capture_output=True, text=True, check=True).stdout.strip())
    elsewhere = tmp_path / "shared-packages"
    (elsewhere / "torch").mkdir(parents=True)
    (elsewhere / "torch" / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\n")
    (site / "shared.pth").write_text(str(elsewhere) + "\n")
    found = detect(env, gpu=False)
    assert found.site_packages == elsewhere
    assert (found.torch_version, found.torch_cuda) == ("2.14.1+cu130", "13.0")


def test_state_folder_is_excluded_in_a_git_worktree(tmp_path):
    from shelltools import run_git
    comfy = make_comfy(tmp_path / "main", git=True)
    worktree = tmp_path / "wt"
    run_git(comfy, "worktree", "add", "-q", "--detach", str(worktree))
    catalog = make_catalog(tmp_path)
    run_cli("apply", "--target", str(worktree), "--patches", str(catalog), check=True)
    porcelain = run_git(worktree, "status", "--porcelain")
    assert ".applier" not in porcelain and "nodes.py" in porcelain
