"""One applier run at a time per target: a file lock in the state folder."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from applier.errors import LockedError

DEFAULT_TIMEOUT_S = 5.0


@contextmanager
def target_lock(state_dir: Path, timeout: float | None = None):
    """Hold the target's lock; wait briefly for another run, then fail with LockedError."""
    if timeout is None:
        timeout = float(os.environ.get("APPLIER_LOCK_TIMEOUT", DEFAULT_TIMEOUT_S))
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(Path(state_dir) / "lock"))
    try:
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise LockedError(f"another applier run holds the lock on {state_dir.parent} (waited {timeout:g} s)",
                          hint="wait for it to finish; if none is running, the lock is released automatically "
                               "when its process ends") from exc
    try:
        yield
    finally:
        lock.release()
