"""What every GPU benchmark script writes the same way: the environment header and the JSON file.

The scripts run as `python benchmarks/<script>.py`, so this module is importable beside them (scripts/ adds
benchmarks/ to sys.path to use it). The header names the command that produced the file; paths of the machine
that ran it are written as placeholders (REPO, TMP, HOME), so a committed result names no machine's folders.
`scripts/index_results.py` reads these headers into benchmarks/results/README.md.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# Folders of the machine that runs a script, longest first, and what a committed file says instead.
_TEMP_ROOTS = ("/tmp", "/var/tmp", tempfile.gettempdir())
_HOME_PATTERN = re.compile(r"(?<![\w./])/(?:home/[^/\s\"']+|root)(?=/|\b)")


def placeholder_paths(text: str) -> str:
    """text with this machine's repository, temporary and home folders replaced by REPO, TMP and HOME."""
    text = text.replace(str(REPO), "REPO")
    for root in sorted(set(_TEMP_ROOTS), key=len, reverse=True):
        text = re.sub(r"(?<![\w./])" + re.escape(root.rstrip("/")) + r"(?=/|\b)", "TMP", text)
    return _HOME_PATTERN.sub("HOME", text)


def scrub(value):
    """value (JSON data) with placeholder_paths applied to every string, keys included."""
    if isinstance(value, str):
        return placeholder_paths(value)
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed from the repository root: `python benchmarks/kernels.py --sweep ...`."""
    argv = list(sys.argv if argv is None else argv)
    env = " ".join(f"{name}={os.environ[name]}" for name in ("PYTHONPATH",) if os.environ.get(name))
    script = argv[0] if argv else ""
    try:
        script = str(Path(script).resolve().relative_to(REPO))
    except ValueError:
        pass
    words = ["python", script, *argv[1:]]
    return placeholder_paths(" ".join(filter(None, [env, shlex.join(words)])))


def environment() -> dict:
    """GPU, its capability, torch/triton/CUDA/Python versions, the UTC time and the command, for a file's header."""
    import torch
    import triton
    return {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command_line()}


INLINE_WIDTH = 120
EXPANDED_DEPTH = 2


def dumps(value, *, _depth: int = 0, _indent: str = "") -> str:
    """JSON for a committed result: containers whose one-line form is short, or that sit deeper than
    EXPANDED_DEPTH, stay on one line; others get one member per line. A table of cases is then one line per case
    (readable in a diff) instead of one line per number."""
    inline = json.dumps(value, separators=(", ", ": "), default=str)
    if not isinstance(value, (dict, list)) or not value or len(inline) <= INLINE_WIDTH or _depth >= EXPANDED_DEPTH:
        return inline
    inner = _indent + " "
    if isinstance(value, dict):
        members = [f"{inner}{json.dumps(str(k))}: {dumps(v, _depth=_depth + 1, _indent=inner)}"
                   for k, v in value.items()]
        return "{\n" + ",\n".join(members) + "\n" + _indent + "}"
    members = [inner + dumps(v, _depth=_depth + 1, _indent=inner) for v in value]
    return "[\n" + ",\n".join(members) + "\n" + _indent + "]"


def write_json(report: dict, out: Path, stem: str) -> Path:
    """Write report (paths as placeholders) to `out` (a file), or to `out/<stem>.json` when out is a folder.

    The stable name is deliberate: a new run replaces the file, and git keeps the earlier ones."""
    path = out / f"{stem}.json" if out.is_dir() else out
    path.write_text(dumps(scrub(report)) + "\n")
    print(f"wrote {path}")
    return path
