"""`make demo`: the main job on a sandbox under the repo: a ComfyUI-shaped tree written by the project plus a venv
with real torch. detect -> apply (per-hunk report) -> status -> verify -> revert -> byte-identical check.
Nothing outside the sandbox folder is touched."""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_tree_builder():
    """The ComfyUI-shaped tree builder the tests use (tests/fixtures/comfy_tree.py; stdlib only)."""
    spec = importlib.util.spec_from_file_location("comfy_tree", REPO / "tests" / "fixtures" / "comfy_tree.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)   # its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def applier(*args: str, check: bool = True) -> int:
    cmd = [sys.executable, "-m", "applier", *args]
    print("$ applier " + " ".join(args), flush=True)
    code = subprocess.run(cmd, cwd=REPO).returncode
    if check and code != 0:
        sys.exit(f"demo: `applier {' '.join(args)}` exited {code}")
    return code


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under roots, __pycache__ and the state folder left out."""
    out = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and ".applier" not in path.parts:
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def make_venv(venv: Path, torch_spec: str) -> Path:
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # The effect checks import torch in this venv, so it gets a full install (the CPU wheel by default).
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", torch_spec],
                   check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sandbox", default="sandbox", help="folder under the repo (created)")
    parser.add_argument("--torch", default="torch==2.13.0", help="pip spec of torch for the sandbox venv")
    args = parser.parse_args()
    sandbox = (REPO / args.sandbox).resolve()
    if REPO not in sandbox.parents:
        sys.exit("demo: the sandbox must be inside the repo")

    step("1. sandbox: a ComfyUI-shaped tree (written by this project) and a venv with real torch")
    comfy = sandbox / "ComfyUI"
    venv = comfy / "venv"
    keep_venv = sandbox / ".venv-keep"
    if venv.exists():  # reuse the slow part (the torch install) between demo runs
        shutil.rmtree(keep_venv, ignore_errors=True)
        venv.rename(keep_venv)
    shutil.rmtree(comfy, ignore_errors=True)
    sandbox.mkdir(parents=True, exist_ok=True)
    load_tree_builder().build_comfy_tree(comfy, era="latest", layout="git")
    if keep_venv.exists():
        keep_venv.rename(venv)
    python = make_venv(venv, args.torch)
    site = Path(subprocess.run([str(python), "-I", "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    print(f"ComfyUI tree: {comfy}\nvenv: {venv}")
    before = snapshot(*(p for p in (comfy, site / "torch" / "cuda") if p.exists()))

    step("2. detect (never imports torch)")
    applier("detect", "--target", str(comfy))

    step("3. list: the catalog and the variant that fits")
    applier("list", "--target", str(comfy))

    step("4. apply: all or nothing, with the per-hunk report")
    applier("apply", "--target", str(comfy))

    step("5. status")
    applier("status", "--target", str(comfy))

    step("6. verify: each patch's effect, in the target's own interpreter")
    applier("verify", "--target", str(comfy), "--real-import", check=False)

    step("7. apply again: nothing is applied twice")
    applier("apply", "--target", str(comfy))

    step("8. revert")
    applier("revert", "--target", str(comfy))

    step("9. byte-identical check")
    after = snapshot(*(p for p in (comfy, site / "torch" / "cuda") if p.exists()))
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    changed = [c for c in changed if "/.git/" not in c]
    if changed:
        print("DIFFERENT after revert:\n  " + "\n  ".join(changed))
        sys.exit(1)
    print(f"all {len(before)} files under the ComfyUI tree and torch/cuda are byte-identical to before apply")
    from applier.store.record import pristine_hashes   # make demo runs .venv's python, where applier is installed
    record = pristine_hashes(site)
    cuda_files = [p for p in (site / "torch" / "cuda").glob("*.py")]
    bad = [p for p in cuda_files
           if record.get(str(p.relative_to(site))) != hashlib.sha256(p.read_bytes()).hexdigest()]
    print(f"torch/cuda/*.py vs torch's RECORD sha256: {len(cuda_files) - len(bad)} match, {len(bad)} differ")
    if bad:
        sys.exit(1)
    print(f"\ndemo finished: it wrote only under {REPO} (the sandbox {sandbox.relative_to(REPO)}/, caches in .cache/)")


if __name__ == "__main__":
    main()
