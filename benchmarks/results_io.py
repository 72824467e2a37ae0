"""What every GPU benchmark script writes the same way: the environment header and the JSON file.

The scripts run as `python benchmarks/<script>.py`, so this module is importable beside them.
"""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch


def environment() -> dict:
    """GPU, its capability, torch/triton/CUDA/Python versions and the UTC time, for a result file's header."""
    import triton
    return {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_json(report: dict, out: Path, stem: str) -> Path:
    """Write report to `out` (a file), or to `out/<stem>-<date>.json` when out is a folder; returns the path."""
    path = out / f"{stem}-{datetime.date.today().isoformat()}.json" if out.is_dir() else out
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return path
