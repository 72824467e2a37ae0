"""The whole product on a real CUDA machine, in one call, with no network (issue: GPU evidence).

    python3 benchmarks/gpu_evidence.py --out DIR [--skip-benchmarks]

1. torch: the machine's own Python env is the target (a throwaway machine): verify (stock), apply every torch
   patch, verify --device cuda, revert, and check every torch/cuda/*.py against torch's RECORD sha256.
2. ComfyUI: a ComfyUI-shaped tree (tests/fixtures/comfy_tree.py) run with the machine's Python: apply, verify
   --real-import --device cuda (the OOM retry probe meets a real out-of-memory there), revert byte-identical.
3. overlays: `applier overlay install`, `verify --kernels --device cuda`, uninstall.
4. benchmarks: norm_order_probe.py, kernels.py (the shipped launch defaults; `kernels.py --sweep` is a separate,
   exploratory call), blocks.py, gpu_fp8_gates.py, gpu_gates.py, each writing its JSON into DIR.
Writes DIR/gpu-evidence.json (every command, exit code, JSON answer, duration) and DIR/evidence.log, and gives
every JSON in DIR the names, the compact layout and the path placeholders of benchmarks/results/ (results_io), so
`python3 scripts/gpu_report.py DIR` reads them and a file can be copied into benchmarks/results/ as it is.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results_io  # noqa: E402  (benchmarks/ is on sys.path when this runs as a script)

REPO = Path(__file__).resolve().parent.parent
LOG: list[str] = []
# what the benchmark scripts call their files -> the names benchmarks/results/ keeps
STABLE_NAMES = {"gpu_fp8_gates.json": "gpu-fp8-gates.json"}


def log(line: str) -> None:
    print(line, flush=True)
    LOG.append(line)


def applier(*args: str, timeout: float = 300) -> dict:
    """Run the CLI as a user would; returns exit code, parsed JSON (when --json), duration."""
    cmd = [sys.executable, "-m", "applier", *args]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = "timeout", exc.stdout or "", exc.stderr or ""
    took = round(time.monotonic() - start, 2)
    entry = {"command": "applier " + " ".join(args), "exit_code": code, "seconds": took}
    try:
        entry["json"] = json.loads(stdout) if "--json" in args else None
    except json.JSONDecodeError:
        entry["stdout_tail"] = stdout[-3000:]
    if "--json" not in args:
        entry["stdout_tail"] = stdout[-3000:]
    if stderr.strip():
        entry["stderr_tail"] = stderr[-3000:]
    log(f"$ {entry['command']}  -> exit {code} in {took}s")
    return entry


def record_check(site: Path) -> dict:
    sys.path.insert(0, str(REPO))
    from applier.record import pristine_hashes
    record = pristine_hashes(site)
    files = sorted((site / "torch" / "cuda").glob("*.py"))
    differ = [str(p.relative_to(site)) for p in files
              if record.get(str(p.relative_to(site))) != hashlib.sha256(p.read_bytes()).hexdigest()]
    return {"files": len(files), "match_record": len(files) - len(differ), "differ": differ}


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and not {".applier", "__pycache__", ".git"} & set(p.relative_to(root).parts)}


def torch_section() -> dict:
    import torch  # the benchmark process may import torch; the applier's own process never does
    site = Path(torch.__file__).resolve().parent.parent
    target = Path(sys.prefix)
    out = {"target": str(target), "site_packages": str(site)}
    out["detect"] = applier("detect", "--target", str(target), "--json")
    out["verify_stock"] = applier("verify", "--target", str(target), "--device", "cuda", "--json")
    out["apply"] = applier("apply", "--target", str(target), "--only", "torch", "--json")
    out["status_applied"] = applier("status", "--target", str(target), "--json")
    out["verify_applied"] = applier("verify", "--target", str(target), "--device", "cuda", "--json")
    out["revert"] = applier("revert", "--target", str(target), "--json")
    out["record_after_revert"] = record_check(site)
    log(f"torch/cuda files matching RECORD after revert: {out['record_after_revert']['match_record']}"
        f"/{out['record_after_revert']['files']}")
    return out


def load_tree_builder():
    """The ComfyUI-shaped tree builder the tests use (tests/fixtures/comfy_tree.py; stdlib only)."""
    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    import comfy_tree
    return comfy_tree


def comfyui_section(work: Path) -> dict:
    comfy = work / "ComfyUI"
    load_tree_builder().build_comfy_tree(comfy, era="latest", layout="git")
    before = tree_hashes(comfy)
    py = ["--python", sys.executable]
    out = {"tree": str(comfy)}
    out["apply"] = applier("apply", "--target", str(comfy), *py, "--only", "comfyui", "--json")
    out["verify_applied"] = applier("verify", "--target", str(comfy), *py, "--real-import", "--device", "cuda",
                                    "--json")
    out["overlay_install"] = applier("overlay", "install", "--target", str(comfy), *py, "--json")
    out["verify_kernels"] = applier("verify", "--target", str(comfy), *py, "--kernels", "--device", "cuda",
                                    "--only", "kernel-parity", "--timeout", "200", "--json", timeout=260)
    out["overlay_uninstall"] = applier("overlay", "uninstall", "--target", str(comfy), *py, "--json")
    out["revert"] = applier("revert", "--target", str(comfy), *py, "--json")
    out["byte_identical_after_revert"] = tree_hashes(comfy) == before
    log(f"ComfyUI tree byte-identical after revert: {out['byte_identical_after_revert']}")
    return out


STARTED = time.monotonic()


def benchmark(script: str, out_dir: Path, *extra: str, deadline_s: float, timeout: float = 240) -> dict:
    remaining = deadline_s - (time.monotonic() - STARTED)
    if remaining < 30:
        log(f"benchmark {script}: not run, {remaining:.0f}s left before the deadline")
        return {"script": script, "exit_code": None, "skipped": "deadline"}
    timeout = min(timeout, remaining)
    start = time.monotonic()
    cmd = [sys.executable, str(REPO / "benchmarks" / script), "--out", str(out_dir), *extra]
    env_path = f"{REPO / 'overlays'}:{REPO}"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout,
                              env={**__import__("os").environ, "PYTHONPATH": env_path})
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = "timeout", str(exc.stdout or "")[-4000:]
    took = round(time.monotonic() - start, 1)
    log(f"benchmark {script}: exit {code} in {took}s")
    return {"script": script, "exit_code": code, "seconds": took, "output_tail": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-benchmarks", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=540,
                        help="start no benchmark after this many seconds (one device call is capped at 600)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch
    import triton
    evidence = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": results_io.command_line(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "capability": list(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    work = Path(tempfile.mkdtemp(prefix="applier-evidence-"))
    try:
        evidence["torch_patches"] = torch_section()
        evidence["comfyui"] = comfyui_section(work)
        if not args.skip_benchmarks:
            deadline = args.deadline_s
            evidence["benchmarks"] = [
                benchmark("norm_order_probe.py", args.out / "norm-order.json", deadline_s=deadline),
                benchmark("kernels.py", args.out / "kernels.json", deadline_s=deadline),
                benchmark("blocks.py", args.out, deadline_s=deadline),
                benchmark("gpu_fp8_gates.py", args.out, deadline_s=deadline),
                benchmark("gpu_gates.py", args.out / "gates.json", deadline_s=deadline),
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        results_io.write_json(evidence, args.out, "gpu-evidence")
        (args.out / "evidence.log").write_text(results_io.placeholder_paths("\n".join(LOG)) + "\n")
        as_kept(args.out)
    return 0


def as_kept(folder: Path) -> None:
    """Every JSON in folder under its benchmarks/results/ name, compact, with the machine's paths as placeholders."""
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        target = folder / STABLE_NAMES.get(path.name, path.name)
        target.write_text(results_io.dumps(results_io.scrub(data)) + "\n")
        if target != path:
            path.unlink()


if __name__ == "__main__":
    sys.exit(main())
