"""A non-editable install (a built wheel, as `pip install .` and `pipx install .` make) carries the catalog, the
verify suite and the overlay pack, and every command works from it.

The wheel is built from a copy of the source (so the checkout gets no build/ folder), without the network
(`pip wheel --no-build-isolation --no-index`), and installed with --no-deps into a fresh venv inside .cache/ that
reaches the test environment's click, unidiff, packaging and filelock through a .pth line. pipx is not needed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

import pytest

from applier import resources
from applier.errors import RefusedError
from applier.resources import find_resource_root
from tests.fixtures.comfy_tree import build_comfy_tree

REPO = Path(__file__).resolve().parent.parent
DATA_FOLDERS = ("patches", "verify", "overlays")
BUILD_FILES = ("setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in")
COMFY_IDS = ("comfyui/max-resolution", "comfyui/oom-retry", "comfyui/pil-pixel-limit")
# The copy's catalog gets this diff rewritten with CRLF line ends: the wheel must keep those bytes, and apply them.
CRLF_DIFF = Path("patches/comfyui/max-resolution/16384-era.diff")


def source_files(folder: Path) -> dict[str, bytes]:
    """Relative path -> bytes of what a build takes from a folder: every file but bytecode and hidden ones."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if not path.is_file() or path.suffix in (".pyc", ".pyo"):
            continue
        if any(part == "__pycache__" or part.startswith(".") or part.endswith(".egg-info") for part in rel.parts):
            continue
        out[rel.as_posix()] = path.read_bytes()
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not {".git", ".applier", "__pycache__"} & set(p.relative_to(root).parts)}


def run(cmd: list[str], env: dict[str, str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


class Installed:
    """The wheel built from a copy of the source, installed into its own venv."""

    def __init__(self, base: Path):
        self.base = base
        self.src = base / "src"
        self.work = base / "work"
        for folder in ("tmp", "cache", "work", "dist"):
            (base / folder).mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTHONHOME", "APPLIER_FAILPOINT", "VIRTUAL_ENV")}
        self.env.update({"TMPDIR": str(base / "tmp"), "XDG_CACHE_HOME": str(base / "cache"),
                         "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "APPLIER_NO_GPU_PROBE": "1"})
        self.copy_source()
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "--no-cache-dir", "-w", base / "dist", self.src], self.env, base)
        wheels = sorted((base / "dist").glob("applier-*.whl"))
        assert len(wheels) == 1, wheels
        self.wheel = wheels[0]
        self.venv = base / "venv"
        run([sys.executable, "-m", "venv", "--without-pip", self.venv], self.env, base)
        self.python = self.venv / "bin" / "python"
        self.site = Path(run([self.python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             self.env, base).stdout.strip())
        # The dependencies come from the test environment: a plain path line (its own .pth files, the editable
        # install's finder among them, are not processed from there), after the venv's own site-packages.
        (self.site / "zz_test_env_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        run([sys.executable, "-m", "pip", "--python", self.python, "install", "--no-deps", "--no-index",
             "--no-cache-dir", self.wheel], self.env, base)
        self.applier = self.venv / "bin" / "applier"

    def copy_source(self) -> None:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".*")
        for name in ("applier", *DATA_FOLDERS):
            shutil.copytree(REPO / name, self.src / name, ignore=ignore)
        for name in BUILD_FILES:
            shutil.copy2(REPO / name, self.src / name)
        diff = self.src / CRLF_DIFF
        text = diff.read_bytes().replace(b"\r\n", b"\n")
        diff.write_bytes(text.replace(b"\n", b"\r\n"))

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run([self.applier, *args], self.env, self.work, check=check)

    def cli_json(self, *args: str, expect: int = 0) -> dict:
        proc = self.cli(*args, "--json", check=False)
        assert proc.returncode == expect, f"applier {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return json.loads(proc.stdout)


def make_resource_folders(root: Path) -> None:
    for name in DATA_FOLDERS:
        (root / name).mkdir(parents=True)


def test_resources_come_from_the_package_copy_in_an_install(tmp_path):
    package = tmp_path / "site-packages" / "applier"
    make_resource_folders(package / "_data")
    make_resource_folders(tmp_path / "site-packages")     # stray top-level folders of other distributions
    assert find_resource_root(package) == (package / "_data", "installed")


def test_resources_come_from_the_checkout_beside_the_package(tmp_path):
    package = tmp_path / "repo" / "applier"
    package.mkdir(parents=True)
    make_resource_folders(tmp_path / "repo")
    (tmp_path / "repo" / "setup.cfg").write_text("[metadata]\nname = applier\n")
    assert find_resource_root(package) == (tmp_path / "repo", "checkout")


def test_folders_beside_an_installed_package_without_build_metadata_are_not_the_catalog(tmp_path):
    package = tmp_path / "site-packages" / "applier"
    package.mkdir(parents=True)
    make_resource_folders(tmp_path / "site-packages")
    assert find_resource_root(package) == (package / "_data", "installed")   # missing: commands say so


def test_a_missing_verify_suite_is_a_refusal_naming_it(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, resources.VERIFY_MODULE_NAME, raising=False)
    monkeypatch.setattr(resources, "VERIFY_DIR", tmp_path / "verify")
    with pytest.raises(RefusedError, match="verify suite is missing") as caught:
        resources.load_verify()
    assert str(tmp_path / "verify") in caught.value.message and caught.value.exit_code == 3


@pytest.fixture(scope="module")
def installed():
    (REPO / ".cache").mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="test-packaging-", dir=REPO / ".cache"))
    try:
        yield Installed(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_the_wheel_carries_catalog_verify_suite_and_overlay_pack_byte_for_byte(installed):
    data = installed.site / "applier" / "_data"
    for name in DATA_FOLDERS:
        built = source_files(installed.src / name)
        assert built, f"{name}/ is empty in the source copy"
        assert source_files(data / name) == built, f"applier/_data/{name} differs from {name}/"
    crlf = (data / CRLF_DIFF).read_bytes()
    assert b"\r\n" in crlf and crlf.count(b"\r\n") == crlf.count(b"\n")
    assert sorted((data / "verify" / "probes").glob("*.py")), "the probes run as scripts: they must be files"
    # every module of the package is in the wheel (setup.cfg lists the subpackages by name)
    package = source_files(installed.src / "applier")
    installed_package = {k: v for k, v in source_files(installed.site / "applier").items()
                         if not k.startswith("_data/")}
    assert installed_package == package


@pytest.mark.slow
def test_the_installed_applier_reads_its_resources_from_the_package(installed):
    code = ("import json, applier, applier.resources as r; print(json.dumps({'package': applier.__file__, "
            "'origin': r.RESOURCE_ORIGIN, 'patches': str(r.PATCHES_DIR), 'verify': str(r.VERIFY_DIR), "
            "'overlays': str(r.OVERLAYS_DIR)}))")
    found = json.loads(run([installed.python, "-c", code], installed.env, installed.work).stdout)
    data = (installed.site / "applier" / "_data").resolve()
    assert Path(found["package"]).resolve() == (installed.site / "applier" / "__init__.py").resolve()
    assert found["origin"] == "installed"
    assert {Path(found[k]) for k in DATA_FOLDERS} == {data / k for k in DATA_FOLDERS}


@pytest.mark.slow
def test_every_command_works_from_the_wheel_and_revert_is_byte_identical(installed):
    tree = build_comfy_tree(installed.base / "sandbox" / "ComfyUI", era="latest", layout="git")
    # the install's own Python: a bare venv (no torch), so the torch patches are not applicable and the
    # comfyui effect probes run in it from the wheel's verify/probes/
    run([sys.executable, "-m", "venv", "--without-pip", tree / "venv"], installed.env, installed.base)
    before = tree_bytes(tree)
    target = ("--target", str(tree))

    assert re.search(r"\d+\.\d+", installed.cli("--version").stdout)
    listed = installed.cli_json("list", *target)
    by_id = {p["id"]: p for p in listed["patches"]}
    assert set(COMFY_IDS) <= set(by_id) and all(by_id[i]["variant"] for i in COMFY_IDS)
    assert "applier revert" in installed.cli("explain", "comfyui/max-resolution").stdout

    applied = installed.cli_json("apply", *target)
    assert sorted(p["id"] for p in applied["patches"] if p["action"] == "apply") == list(COMFY_IDS)
    assert {p["id"]: p["variant"] for p in applied["patches"] if p["action"] == "apply"}[
        "comfyui/max-resolution"] == CRLF_DIFF.stem   # the CRLF copy of the diff is the one that applied
    assert re.search(rb"^MAX_RESOLUTION\s*=\s*40960\s*$", (tree / "nodes.py").read_bytes(), re.M)
    status = installed.cli_json("status", *target)
    assert {p["id"] for p in status["patches"] if p["recorded"]} == set(COMFY_IDS) and not status["drift"]

    report = installed.cli_json("verify", *target, "--real-import")
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and checks["max-resolution"]["outcome"] == "PASS", report
    # each comfyui patch's probe ran as a script from applier/_data/verify/probes in the target's interpreter
    assert {i: checks[f"effect:{i}"]["outcome"] for i in COMFY_IDS} == dict.fromkeys(COMFY_IDS, "PASS"), checks

    overlay = installed.cli_json("overlay", "install", *target)
    target_site = Path(run([tree / "venv" / "bin" / "python", "-I", "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           installed.env, installed.work).stdout.strip())
    for rel, data in source_files(installed.src / "overlays" / "fused_dit").items():
        assert (target_site / "fused_dit" / rel).read_bytes() == data
    listed_overlay = installed.cli_json("overlay", "list", *target)
    assert listed_overlay["installed"] and listed_overlay["intact"] == len(overlay["files"]) > 0, listed_overlay
    installed.cli_json("overlay", "uninstall", *target)
    assert not installed.cli_json("overlay", "list", *target)["installed"]

    reverted = installed.cli_json("revert", *target)
    assert {p["id"] for p in reverted["patches"]} == set(COMFY_IDS)
    assert tree_bytes(tree) == before
    assert not [p["id"] for p in installed.cli_json("status", *target)["patches"] if p["recorded"]]


@pytest.mark.slow
def test_the_sdist_carries_what_the_wheel_is_built_from(installed):
    out = installed.base / "sdist"
    out.mkdir()
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    name = run([sys.executable, "-c", code, out], installed.env, installed.src).stdout.strip().splitlines()[-1]
    with tarfile.open(out / name) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()}
    for folder in DATA_FOLDERS:
        missing = [rel for rel in source_files(installed.src / folder) if f"{folder}/{rel}" not in members]
        assert not missing, f"the sdist lacks {folder}/: {missing}"
    assert {"setup.cfg", "pyproject.toml", "README.md"} <= members
