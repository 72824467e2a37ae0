#!/usr/bin/env python3
"""Maintainer check: applier's torch patches on real torch installs, proven pristine again after revert.

For every --target venv: hash every site-packages/torch/cuda/*.py against torch's RECORD (must be pristine
before), `applier detect`, `applier apply --only torch`, note which files now differ from RECORD,
`applier verify`, `applier status`, `applier revert`, and hash again (must be pristine after). Everything goes
to one JSON file. apply + revert modify the venv for a while: never point it at a venv others are using.

Example:
    python3 scripts/validate_torch_env.py --target VENV214 VENV213 --out benchmarks/results/real-torch-envs.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import results_io  # noqa: E402  (stdlib only: the results' layout and path placeholders)
sys.path.insert(0, str(REPO_ROOT))
from applier.record import find_record, pristine_hashes  # noqa: E402

DEFAULT_APPLIER = REPO_ROOT / ".venv" / "bin" / "applier"
TAIL_CHARS = 3000


def applier(applier_bin: Path, *args: str) -> dict:
    start = time.monotonic()
    proc = subprocess.run([str(applier_bin), *args, "--json"], capture_output=True, text=True, timeout=900)
    entry: dict = {"rc": proc.returncode, "seconds": round(time.monotonic() - start, 2)}
    try:
        entry["json"] = json.loads(proc.stdout)
    except ValueError:
        entry["stdout_tail"] = proc.stdout[-TAIL_CHARS:]
    if proc.returncode != 0 or "json" not in entry:
        entry["stderr_tail"] = proc.stderr[-TAIL_CHARS:]
    return entry


def site_packages_of(python: Path) -> Path:
    out = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def cuda_py_against_record(site_packages: Path) -> dict:
    """Every torch/cuda/*.py on disk vs its RECORD sha256: the files that differ, and any RECORD lacks."""
    record = pristine_hashes(site_packages)
    files = sorted((site_packages / "torch" / "cuda").glob("*.py"))
    differing, unlisted = [], []
    for path in files:
        rel = path.relative_to(site_packages).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if rel not in record:
            unlisted.append(rel)
        elif record[rel] != digest:
            differing.append(rel)
    return {"files_checked": len(files), "differ_from_record": differing, "not_in_record": unlisted,
            "pristine": bool(files) and not differing and not unlisted}


def check_target(target: Path, applier_bin: Path) -> dict:
    python = target / "bin" / "python"
    site_packages = site_packages_of(python)
    version = subprocess.run([str(python), "-I", "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True).stdout.strip()
    record = find_record(site_packages, "torch")
    entry: dict = {"target": str(target), "python": version, "site_packages": str(site_packages),
                   "torch_record": record.parent.name if record else None}
    torch_version_file = site_packages / "torch" / "version.py"
    if torch_version_file.exists():
        for line in torch_version_file.read_text().splitlines():
            if line.startswith(("__version__", "cuda")):
                key, value = line.split("=", 1)
                entry["torch_" + key.split(":")[0].strip().strip("_")] = value.split("#")[0].strip().strip("'\"")
    entry["before"] = cuda_py_against_record(site_packages)
    timings = {}
    for step, args in (("detect", ["detect"]), ("apply", ["apply", "--only", "torch"])):
        result = applier(applier_bin, *args, "--target", str(target))
        entry[step] = result
        timings[step] = result["seconds"]
    entry["after_apply"] = cuda_py_against_record(site_packages)
    for step, args in (("verify", ["verify"]), ("status", ["status"]), ("revert", ["revert"])):
        result = applier(applier_bin, *args, "--target", str(target))
        timings[step] = result["seconds"]
        if step == "verify":
            checks = (result.get("json") or {}).get("checks", [])
            result = {"rc": result["rc"], "checks": [{k: c.get(k) for k in ("name", "outcome", "reason")}
                                                     for c in checks],
                      **{k: result[k] for k in ("stderr_tail", "stdout_tail") if k in result}}
        entry[step] = result
    entry["after_revert"] = cuda_py_against_record(site_packages)
    entry["timings_s"] = timings
    entry["ok"] = (entry["before"]["pristine"] and entry["after_revert"]["pristine"]
                   and entry["apply"]["rc"] == 0 and entry["revert"]["rc"] == 0)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, nargs="+", required=True, help="venvs holding a torch wheel")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--applier", type=Path, default=DEFAULT_APPLIER)
    args = parser.parse_args()
    result = {"generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "script": "scripts/validate_torch_env.py", "command": results_io.command_line(),
              "applier_commit": subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                                               capture_output=True, text=True).stdout.strip(),
              "envs": []}
    for target in args.target:
        print(f"== {target}", flush=True)
        try:
            entry = check_target(target.resolve(), args.applier)
        except Exception as exc:  # one broken env must not hide the others
            entry = {"target": str(target), "error": f"{type(exc).__name__}: {exc}"}
        result["envs"].append(entry)
        print(json.dumps({k: entry.get(k) for k in ("torch_version", "ok", "error")}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results_io.write_json(result, args.out, "real-torch-envs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
