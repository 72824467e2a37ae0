"""The environment variables applier reads: each is read here, checked, and turned into a value or a clear error.

    APPLIER_LOCK_TIMEOUT     seconds to wait for another run's lock on the target: 0 to 86400 (lock.py's default
                             when unset: 5, 30 for commands that only read)
    APPLIER_DETECT_TIMEOUT   seconds that lower the timeouts of detection's children (the interpreter, git,
                             nvidia-smi): a number above 0; it never raises one
    APPLIER_NO_GPU_PROBE     1: do not run nvidia-smi; 0: run it (the default)
    APPLIER_FAILPOINT        a failpoint name (applier/store/failpoints.py): the crash tests' kill switch
    NO_COLOR                 any non-empty value: no colour in the output (https://no-color.org)

Unset or empty is the default. Anything else that is not a valid value (`abc`, `nan`, `inf`, a negative number, a
failpoint that does not exist) is a BadSetting: exit 2, as for a bad option, with a message naming the variable,
what it holds and what it takes, never a traceback and never silently ignored. The CLI checks them all before any
command runs (check_environment); each reader checks its own again for callers that do not come through the CLI.
"""
from __future__ import annotations

import math
import os

from applier.errors import EXIT_USAGE, ApplierError

LOCK_TIMEOUT = "APPLIER_LOCK_TIMEOUT"
DETECT_TIMEOUT = "APPLIER_DETECT_TIMEOUT"
NO_GPU_PROBE = "APPLIER_NO_GPU_PROBE"
FAILPOINT = "APPLIER_FAILPOINT"
NO_COLOR = "NO_COLOR"

# the failpoints applier/store/failpoints.py defines, named here so that this leaf module reads the store's kill
# switch without importing the store (the store reads its settings from here)
RUN_FAILPOINTS = ("after-backups", "after-journal", "after-first-file", "after-files", "after-state")
EXPORT_FAILPOINTS = ("export-staged", "export-file-moved")     # `overlay export` (store/staged.py)
FAILPOINT_NAMES = RUN_FAILPOINTS + EXPORT_FAILPOINTS

MAX_LOCK_WAIT_S = 24 * 3600.0      # a lock nobody releases within a day is not worth waiting for


class BadSetting(ApplierError):
    """An environment variable applier reads holds a value it cannot use (exit 2, a usage error)."""

    exit_code = EXIT_USAGE


def _raw(variable: str) -> str | None:
    """The variable's value, None when it is unset or empty (both mean: the default)."""
    return os.environ.get(variable) or None


def _refuse(variable: str, raw: str, takes: str) -> BadSetting:
    return BadSetting(f"{variable}={raw!r} is not valid: it takes {takes}",
                      hint=f"set it to such a value, or unset it for the default (`unset {variable}`)")


def _seconds(variable: str, raw: str, *, low: float, high: float, low_included: bool, takes: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise _refuse(variable, raw, takes) from None
    if not math.isfinite(value) or value > high or value < low or (value == low and not low_included):
        raise _refuse(variable, raw, takes)
    return value


def lock_timeout(default: float) -> float:
    """Seconds to wait for the target's lock: APPLIER_LOCK_TIMEOUT, or `default` when it is unset."""
    raw = _raw(LOCK_TIMEOUT)
    if raw is None:
        return default
    return _seconds(LOCK_TIMEOUT, raw, low=0.0, high=MAX_LOCK_WAIT_S, low_included=True,
                    takes=f"a number of seconds from 0 to {MAX_LOCK_WAIT_S:g}")


def detect_timeout(default: float) -> float:
    """`default`, lowered (never raised) by APPLIER_DETECT_TIMEOUT."""
    raw = _raw(DETECT_TIMEOUT)
    if raw is None:
        return default
    return min(default, _seconds(DETECT_TIMEOUT, raw, low=0.0, high=math.inf, low_included=False,
                                 takes="a number of seconds above 0 (it only ever lowers detection's timeouts)"))


def gpu_probe_off() -> bool:
    """APPLIER_NO_GPU_PROBE=1: detection does not run nvidia-smi."""
    raw = _raw(NO_GPU_PROBE)
    if raw not in (None, "0", "1"):
        raise _refuse(NO_GPU_PROBE, raw, "1 (do not run nvidia-smi) or 0 (run it)")
    return raw == "1"


def failpoint() -> str | None:
    """The failpoint named in APPLIER_FAILPOINT, None when none is."""
    raw = _raw(FAILPOINT)
    if raw is not None and raw not in FAILPOINT_NAMES:
        raise _refuse(FAILPOINT, raw, f"one of the failpoint names {', '.join(FAILPOINT_NAMES)}")
    return raw


def no_color() -> bool:
    """NO_COLOR set to anything but the empty string: no colour (https://no-color.org)."""
    return _raw(NO_COLOR) is not None


def check_environment() -> None:
    """Every variable above checked at once (BadSetting for the first bad one), before a command does anything."""
    lock_timeout(0.0)
    detect_timeout(math.inf)
    gpu_probe_off()
    failpoint()
