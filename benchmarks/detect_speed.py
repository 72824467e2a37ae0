"""`applier detect` never imports torch: time it against `python -c "import torch"` with the target's interpreter.

    python benchmarks/detect_speed.py --target VENV [--repeats 7] [--out benchmarks/results/detect-speed.json]

Both are timed as whole commands (wall clock, median of repeats after one warm-up each), as a user runs them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import results_io

REPO = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], repeats: int) -> list[float]:
    subprocess.run(cmd, capture_output=True, check=True)      # warm the page cache
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=Path, required=True, help="a venv with torch installed")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=results_io.RESULTS, help="a JSON file, or a folder for detect-speed.json")
    args = parser.parse_args()
    detected = json.loads(subprocess.run([sys.executable, "-m", "applier", "detect", "--target", str(args.target),
                                          "--json"], capture_output=True, text=True, check=True, cwd=REPO).stdout)
    python = detected["python"]
    detect_s = wall([sys.executable, "-m", "applier", "detect", "--target", str(args.target), "--json"],
                    args.repeats)
    import_s = wall([python, "-c", "import torch"], args.repeats)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": results_io.command_line(), "machine": platform.platform(), "cpus": os.cpu_count(),
        "target": str(args.target), "target_python": python, "torch": detected["torch_version"],
        "applier_python": sys.executable,
        "detect_s": detect_s, "import_torch_s": import_s,
        "detect_median_s": statistics.median(detect_s), "import_torch_median_s": statistics.median(import_s),
    }
    result["ratio"] = result["detect_median_s"] / result["import_torch_median_s"]
    result["under_a_quarter"] = result["ratio"] < 0.25
    path = results_io.write_json(result, args.out, "detect-speed")
    print(f"applier detect {result['detect_median_s']:.3f} s vs import torch {result['import_torch_median_s']:.3f} s "
          f"({100 * result['ratio']:.1f}%) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
