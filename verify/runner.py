"""Run a probe (verify/probes/<name>.py) in the target's interpreter and turn whatever happens into a result.

The probe runs as `python -I probes/<name>.py '<json args>'` in an empty temporary folder (isolated mode: no user
site, no PYTHON* variables, no current folder on sys.path, so nothing of the applier's environment leaks in). Its
last stdout line must be one JSON object (see verify/README.md). A crash, a non-zero exit, a hang past the timeout
or output that is not that JSON is a FAIL with the reason in words; a missing interpreter is a SKIP. This module
never raises for anything the probe does.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .registry import CheckResult, Outcome

PROBES_DIR = Path(__file__).resolve().parent / "probes"
STDERR_TAIL_CHARS = 4000
# A leading underscore marks a module the probes share (probes/_probe.py), not a probe that can be run.
_PROBE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# Variables that would make the target's interpreter load something other than what it would load on its own.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "PYTHONUSERBASE")


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
              env_extra: dict[str, str | None] | None = None, *, probes_dir: Path | None = None) -> ProbeResult:
    """Run one probe and read its verdict; see the module docstring for how failures are classified.
    `probes_dir` replaces verify/probes/ (tests run probes of their own)."""
    if python is None:
        return ProbeResult(Outcome.SKIP, "no Python interpreter found for the target")
    python = Path(python)
    if not python.exists():
        return ProbeResult(Outcome.SKIP, f"the target's interpreter {python} does not exist")
    script = probe_path(probe, probes_dir)
    if script is None:
        return ProbeResult(Outcome.FAIL, f"no probe named {probe!r} in {probes_dir or PROBES_DIR}")
    try:
        payload = json.dumps(args)
    except (TypeError, ValueError) as exc:
        return ProbeResult(Outcome.FAIL, f"probe arguments are not JSON: {exc}")

    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    for key, value in (env_extra or {}).items():  # None removes an inherited variable
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env.setdefault("PYTHONIOENCODING", "utf-8")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="applier-probe-") as workdir:
        try:
            proc = subprocess.Popen(
                [str(python), "-I", str(script), payload], cwd=workdir, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                **_new_process_group())
        except OSError as exc:
            return ProbeResult(Outcome.FAIL, f"cannot start {python}: {exc.strerror or exc}",
                               duration_s=time.monotonic() - started)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            out, err = _drain(proc)
            return ProbeResult(Outcome.FAIL, f"probe {probe} did not finish within {timeout:g} s (killed)",
                               stderr=_tail(err), duration_s=time.monotonic() - started)
    duration = time.monotonic() - started
    return _classify(probe, proc.returncode, out, err, duration)


def _classify(probe: str, returncode: int, out: bytes, err: bytes, duration: float) -> ProbeResult:
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


def _parse_last_line(out: bytes) -> tuple[dict | None, str]:
    """The verdict object of the last non-empty stdout line, or None and why it is not one."""
    text = out.decode("utf-8", errors="replace")
    line = _last_line(text)
    if not line:
        return None, "stdout was empty"
    shown = line if len(line) <= 200 else line[:200] + "..."
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None, f"last line is not JSON: {shown!r}"
    if not isinstance(data, dict):
        return None, f"last line is JSON but not an object: {shown!r}"
    outcome = data.get("outcome")
    if outcome not in Outcome.__members__:
        return None, f"unknown outcome {outcome!r} in {shown!r}"
    reason = data.get("reason")
    numbers = data.get("numbers", {})
    if not isinstance(reason, str) or not isinstance(numbers, dict):
        return None, f"'reason' must be a string and 'numbers' an object: {shown!r}"
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


def _new_process_group() -> dict:
    # A group of its own lets a timeout kill the probe's children too (a hung compile worker, a server).
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _kill_tree(proc: subprocess.Popen) -> None:
    if sys.platform != "win32":
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            pass
    proc.kill()


def _drain(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    """What the killed probe had written; bounded, because a grandchild outside the group may hold the pipes."""
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()
        return b"", b""
