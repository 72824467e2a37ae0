"""Helpers for the shell tests: a small test catalog, small ComfyUI-shaped trees, a venv with real torch files,
and a way to run the CLI as a user does (a subprocess, so failpoints can kill it)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

NODES_PY = (
    "import os\n"
    "\n"
    "MAX_RESOLUTION=16384\n"
    "\n"
    "class EmptyLatentImage:\n"
    "    @classmethod\n"
    "    def INPUT_TYPES(s):\n"
    "        return {'required': {'width': ('INT', {'default': 512, 'max': MAX_RESOLUTION})}}\n"
)
EXECUTION_PY = (
    "def execute(node):\n"
    "    return node()\n"
)


def write_patch(catalog: Path, patch_id: str, variants: list[tuple[str, str, str]], **meta) -> Path:
    """A catalog entry: variants as (name, specifier, diff text)."""
    folder = catalog / patch_id
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f'title = "{meta.get("title", patch_id)}"', f'summary = "{meta.get("summary", "test patch")}"']
    if "default" in meta:
        lines.append(f"default = {str(meta['default']).lower()}")
    for name, spec, diff in variants:
        (folder / f"{name}.diff").write_bytes(diff.encode())
        lines += ["", "[[variant]]", f'name = "{name}"', f'versions = "{spec}"', f'diff = "{name}.diff"']
    (folder / "patch.toml").write_text("\n".join(lines) + "\n")
    return folder


MAXRES_DIFF = """\
--- a/nodes.py
+++ b/nodes.py
@@ -2,3 +2,3 @@
 
-MAX_RESOLUTION=16384
+MAX_RESOLUTION=40960
 
"""
EXEC_DIFF = """\
--- a/execution.py
+++ b/execution.py
@@ -1,2 +1,3 @@
 def execute(node):
+    # retried once by the test patch
     return node()
"""


def make_catalog(root: Path) -> Path:
    catalog = root / "catalog"
    write_patch(catalog, "comfyui/maxres", [("all", ">=0", MAXRES_DIFF)])
    write_patch(catalog, "comfyui/exec", [("all", ">=0", EXEC_DIFF)])
    return catalog


def make_comfy(root: Path, *, version: str | None = "0.3.60", git: bool = False) -> Path:
    comfy = root / "ComfyUI"
    comfy.mkdir(parents=True)
    (comfy / "nodes.py").write_text(NODES_PY)
    (comfy / "execution.py").write_text(EXECUTION_PY)
    if version:
        (comfy / "comfyui_version.py").write_text(f'__version__ = "{version}"\n')
    if git:
        run_git(comfy, "init", "-q")
        run_git(comfy, "add", "-A")
        run_git(comfy, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    return comfy


def run_git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".applier" not in p.parts and "__pycache__" not in p.parts and ".git" not in p.parts}


def run_cli(*args: str, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "APPLIER_FAILPOINT"}
    full_env = {**base, "APPLIER_NO_GPU_PROBE": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "applier", *args], capture_output=True, text=True, env=full_env,
                          cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"applier {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def cli_json(*args: str, **kw) -> tuple[int, dict]:
    proc = run_cli(*args, "--json", **kw)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON ({proc.returncode}): {proc.stdout}\n{proc.stderr}") from exc


def real_torch_site() -> Path:
    """site-packages of the torch installed beside the tests; the calling test is skipped without one."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed: this test copies the installed torch's files (pip install -e '.[kernels]')")
    return Path(spec.origin).parent.parent


def make_torch_env(root: Path) -> tuple[Path, Path]:
    """A real venv (no pip) whose site-packages holds copies of the real torch's cuda/*.py, version.py and
    dist-info (RECORD included): enough for detection, patching and RECORD checks, without copying 1 GB."""
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-I", "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    real = real_torch_site()
    (site / "torch").mkdir(parents=True, exist_ok=True)
    for src in sorted((real / "torch" / "cuda").glob("*.py")):
        dest = site / "torch" / "cuda" / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
    shutil.copy2(real / "torch" / "version.py", site / "torch" / "version.py")
    for dist in real.glob("torch-*.dist-info"):
        shutil.copytree(dist, site / dist.name)
    return env, site
