"""Reliability round 4 (issue 49): the overlay package's home is the target environment's own site-packages (its
interpreter's sysconfig purelib), never a parent environment's where torch is found; torch patches still go where
torch is; `status` and `overlay check` say where each part is.

The parent environment: a shared venv holding torch, made visible to each ComfyUI's own venv by a .pth file in that
venv's site-packages, as `--system-site-packages` shows the base installation's (the test cannot write into the base
interpreter's own site-packages). Detection then finds torch in the shared folder, as it did on the device machine."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reltools import assert_clean, cli, make_install, record_figure, snapshot
from shelltools import make_catalog, make_comfy

pytestmark = pytest.mark.slow


def venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    return Path(subprocess.run([str(folder / "bin" / "python"), "-I", "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture
def shared(tmp_path):
    """A parent environment with torch (2.13.0 by its version.py) in its site-packages."""
    site = venv(tmp_path / "shared-env")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text('__version__ = "2.13.0"\ncuda = None\n')
    return site


def comfy_on(tmp_path: Path, name: str, shared: Path) -> tuple[Path, Path]:
    comfy = make_comfy(tmp_path / name)
    (comfy / "custom_nodes").mkdir()
    (comfy / "comfy").mkdir()
    for module in ("model_base.py", "ops.py"):     # enough ComfyUI code for `overlay check` to read (all stock)
        (comfy / "comfy" / module).write_text("")
    own = venv(comfy / "venv")
    (own / "shared-env.pth").write_text(str(shared) + "\n")
    return comfy, own


def test_the_package_goes_to_the_environments_own_site_packages(tmp_path, shared):
    catalog = make_catalog(tmp_path)
    before = snapshot(shared)
    homes = []
    for name in ("first", "second"):      # two ComfyUIs on one parent environment: the second is not refused
        comfy, own = comfy_on(tmp_path, name, shared)
        base = ("--target", comfy, "--patches", catalog)
        found = assert_clean(cli("detect", *base, "--json"), allowed=(0,)).json()
        assert found["site_packages"] == str(shared) and found["purelib"] == str(own), found
        assert_clean(cli("overlay", "install", *base), allowed=(0,))
        assert (own / "fused_dit" / "__init__.py").is_file()
        assert snapshot(shared) == before, "the parent environment was written"
        status = assert_clean(cli("status", *base), allowed=(0,))
        assert f"torch patches in {shared}" in status.stdout and f"overlay package in {own}" in status.stdout
        assert f"its kernels package: {own / 'fused_dit'}" in status.stdout
        check = assert_clean(cli("overlay", "check", *base), allowed=(0,))
        assert f"overlay package in {own}" in check.stdout
        data = assert_clean(cli("status", *base, "--json"), allowed=(0,)).json()
        assert data["purelib"] == str(own) and data["site_packages"] == str(shared)
        homes.append(own)
    for name, own in zip(("first", "second"), homes):
        comfy = tmp_path / name / "ComfyUI"
        assert_clean(cli("overlay", "uninstall", "--target", comfy, "--patches", catalog), allowed=(0,))
        assert not (own / "fused_dit").exists()
    assert snapshot(shared) == before
    record_figure("round4-home", tried=2, held=2)


def test_a_manifest_an_older_applier_wrote_is_still_the_same_files(tmp_path):
    """Before this round the manifest named the package's files under the root "site-packages"; where that is the
    environment's own folder (the usual venv), a reinstall and an uninstall treat them as the same files."""
    inst = make_install(tmp_path / "t", layout="venv")
    assert_clean(cli(*inst.args("overlay", "install")), allowed=(0,))
    manifest = inst.root / ".applier" / "overlays.json"
    data = json.loads(manifest.read_text())
    assert {f["root"] for f in data["files"]} == {"purelib", "comfyui"}
    for entry in data["files"]:
        if entry["root"] == "purelib":
            entry["root"] = "site-packages"
    manifest.write_text(json.dumps(data, indent=2) + "\n")
    listed = assert_clean(cli(*inst.args("overlay", "list", "--json")), allowed=(0,)).json()
    assert listed["intact"] == len(data["files"]) and not listed["missing"], listed
    again = assert_clean(cli(*inst.args("overlay", "install", "--json")), allowed=(0,)).json()
    assert again["changed"] == 0
    assert_clean(cli(*inst.args("overlay", "uninstall")), allowed=(0,))
    assert snapshot(inst.root) == (inst.base_files, inst.base_dirs)
