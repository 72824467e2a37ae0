"""Run a probe (verify/probes/<name>.py) in the target's interpreter and turn whatever happens into a result.

The probe runs as `python -I -X utf8 probes/<name>.py '<json args>'` through applier.subproc.run_bounded, in an
empty temporary folder that is also its TMPDIR and TORCHINDUCTOR_CACHE_DIR (so torch.compile's caches and anything
else it puts in a temp folder go when it ends: no `$TMPDIR/torchinductor_<user>` is left behind). Isolated mode: no
user site, no PYTHON* variables, no current folder on sys.path, so nothing of the applier's environment leaks in;
UTF-8 mode, so paths and output survive any locale. `applier verify --keep-pythonpath` runs it with -s instead of
-I and PYTHONPATH kept (every other PYTHON* variable still dropped), for a target whose interpreter needs it. Its
last stdout line must be one JSON object (see verify/README.md). A crash, a non-zero exit, a hang past the
timeout, more than PROBE_STDOUT_LIMIT bytes of stdout, bytes that are not UTF-8, or output that is not that JSON is
a FAIL with the reason in words (the process group is killed); a missing interpreter is a SKIP. This module never
raises for anything the probe does.
"""
from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from applier.detect import PYTHON_HINT
from applier.errors import ChildFailure
from applier.subproc import PYTHON_FLAGS, child_env, run_bounded

from .registry import CheckResult, Outcome

PROBES_DIR = Path(__file__).resolve().parent / "probes"
STDERR_TAIL_CHARS = 4000
MAX_REASON_CHARS = 2000
PROBE_STDOUT_LIMIT = 16 * 1024 * 1024     # a verdict is one line of numbers; chatter before it is not kept
PROBE_STDERR_KEPT = 256 * 1024            # stderr beyond this is dropped from the front (a tail is shown)
# A leading underscore marks a module the probes share (probes/_probe.py), not a probe that can be run.
_PROBE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# Variables that would make the target's interpreter load something other than what it would load on its own.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "PYTHONUSERBASE")
# With keep_pythonpath (`applier verify --keep-pythonpath`): -s instead of -I, so that PYTHONPATH is read, and every
# other PYTHON* variable dropped (PYTHONINSPECT would leave the probe waiting at a prompt until its timeout).
KEEP_PYTHONPATH_FLAGS = ("-s", "-B", "-X", "utf8")
KEEP_PYTHONPATH_HINT = ("PYTHONPATH is set but the checks run isolated (python -I), without it, as ComfyUI started "
                        "from its own folder would; `applier verify --keep-pythonpath` passes it on")


@dataclass
class ProbeResult:
    outcome: Outcome
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""
    duration_s: float = 0.0
    returncode: int | None = None     # None: the probe did not run or did not finish

    def to_check(self, name: str) -> CheckResult:
        return CheckResult(name, self.outcome, self.reason, dict(self.numbers), self.stderr, self.duration_s)


def probe_path(probe: str, probes_dir: Path | None = None) -> Path | None:
    if not _PROBE_NAME.match(probe or ""):
        return None
    path = (probes_dir or PROBES_DIR) / f"{probe}.py"
    return path if path.is_file() else None


def run_probe(python: Path | str | None, probe: str, args: dict, timeout: float,
              env_extra: dict[str, str | None] | None = None, *, probes_dir: Path | None = None,
              keep_pythonpath: bool = False) -> ProbeResult:
    """Run one probe and read its verdict; see the module docstring for how failures are classified.
    `probes_dir` replaces verify/probes/ (tests run probes of their own); keep_pythonpath passes PYTHONPATH on.
    A probe that fails on a missing module while PYTHONPATH was left out says so, and how to keep it."""
    if python is None:
        return ProbeResult(Outcome.SKIP, f"no Python interpreter found for the target; {PYTHON_HINT}")
    python = Path(python)
    if not python.exists():
        return ProbeResult(Outcome.SKIP, f"the target's interpreter {python} does not exist; {PYTHON_HINT}")
    script = probe_path(probe, probes_dir)
    if script is None:
        return ProbeResult(Outcome.FAIL, f"no probe named {probe!r} in {probes_dir or PROBES_DIR}")
    try:
        payload = json.dumps(args)
    except (TypeError, ValueError) as exc:
        return ProbeResult(Outcome.FAIL, f"probe arguments are not JSON: {exc}")

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="applier-probe-", ignore_cleanup_errors=True) as workdir:
        own_temp = {"TMPDIR": workdir, "TEMP": workdir, "TMP": workdir,
                    "TORCHINDUCTOR_CACHE_DIR": str(Path(workdir) / "torchinductor")}
        if keep_pythonpath:
            flags, drop = KEEP_PYTHONPATH_FLAGS, tuple(k for k in os.environ if k.startswith("PYTHON")
                                                       and k != "PYTHONPATH")
        else:
            flags, drop = PYTHON_FLAGS, _DROPPED_ENV
        env = child_env({**own_temp, **(env_extra or {})}, drop=drop)
        try:
            result = run_bounded([python, *flags, script, payload], what=f"probe {probe}", timeout=timeout,
                                 stdout_limit=PROBE_STDOUT_LIMIT, stderr_limit=PROBE_STDERR_KEPT, stderr_tail=True,
                                 env=env, cwd=workdir)
            out = result.text()
        except ChildFailure as exc:
            return ProbeResult(Outcome.FAIL, exc.message, stderr=_tail(exc.stderr),
                               duration_s=time.monotonic() - started)
    found = _classify(probe, result.returncode, out, result.stderr, result.duration_s)
    if (found.outcome is Outcome.FAIL and not keep_pythonpath and os.environ.get("PYTHONPATH")
            and "ModuleNotFoundError" in found.reason + found.stderr):
        found.reason += f" ({KEEP_PYTHONPATH_HINT})"
    return found


def _classify(probe: str, returncode: int, out: str, err: bytes, duration: float) -> ProbeResult:
    stderr = _tail(err)
    verdict, problem = _parse_last_line(out)
    if returncode != 0:
        if returncode < 0:
            try:
                how = f"was killed by {signal.Signals(-returncode).name}"
            except ValueError:
                how = f"was killed by signal {-returncode}"
        else:
            how = f"exited with status {returncode}"
        last_error = _last_line(stderr)
        reason = f"probe {probe} {how}" + (f": {last_error}" if last_error else "")
        numbers = verdict.get("numbers", {}) if verdict else {}
        return ProbeResult(Outcome.FAIL, reason, numbers, stderr, duration, returncode)
    if verdict is None:
        return ProbeResult(Outcome.FAIL, f"probe {probe} printed no verdict: {problem}", {}, stderr, duration,
                           returncode)
    return ProbeResult(Outcome(verdict["outcome"]), verdict["reason"], verdict["numbers"], stderr, duration,
                       returncode)


def _parse_last_line(text: str) -> tuple[dict | None, str]:
    """The verdict object of the last non-empty stdout line, or None and why it is not one."""
    line = _last_line(text)
    if not line:
        return None, "stdout was empty"
    shown = line if len(line) <= 200 else line[:200] + "..."
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None, f"last line is not JSON: {shown!r}"
    if not isinstance(data, dict):
        return None, f"last line is JSON but not an object: {shown!r}"
    outcome = data.get("outcome")
    if not isinstance(outcome, str) or outcome not in Outcome.__members__:
        return None, f"unknown outcome {outcome!r} in {shown!r}"
    reason = data.get("reason")
    numbers = data.get("numbers", {})
    if not isinstance(reason, str) or not isinstance(numbers, dict):
        return None, f"'reason' must be a string and 'numbers' an object: {shown!r}"
    if len(reason) > MAX_REASON_CHARS:     # one line of the report, not a log
        reason = reason[:MAX_REASON_CHARS] + f"... ({len(reason)} characters)"
    return {"outcome": outcome, "reason": reason, "numbers": numbers}, ""


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def _tail(data: bytes | str | None) -> str:
    if not data:
        return ""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return text[-STDERR_TAIL_CHARS:]
