"""One applier run at a time per target: a file lock in the state folder."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from applier.errors import LockedError, StateCorruptError
from applier.fsutil import io_failure

DEFAULT_TIMEOUT_S = 5.0
READER_TIMEOUT_S = 30.0     # a read-only command waits out a run in flight rather than fail beside it


@contextmanager
def target_lock(state_dir: Path, timeout: float | None = None, *, reader: bool = False):
    """Hold the target's lock; wait briefly for another run (readers longer), then fail with LockedError."""
    if timeout is None:
        default = READER_TIMEOUT_S if reader else DEFAULT_TIMEOUT_S
        timeout = float(os.environ.get("APPLIER_LOCK_TIMEOUT", default))
    state_dir = Path(state_dir)
    if state_dir.exists() and not state_dir.is_dir():
        raise StateCorruptError(f"{state_dir} is not a folder",
                                hint="applier keeps its state in that folder: move the file aside")
    lock_path = state_dir / "lock"
    if lock_path.is_dir() or lock_path.is_symlink():
        raise StateCorruptError(f"{lock_path} is not a plain file",
                                hint="applier's lock file must be a plain file: move it aside")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path))
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise LockedError(f"another applier run holds the lock on {state_dir.parent} (waited {timeout:g} s)",
                          hint="wait for it to finish; if none is running, the lock is released automatically "
                               "when its process ends") from exc
    except OSError as exc:
        raise io_failure(exc, state_dir, "take the lock in") from exc
    try:
        yield
    finally:
        lock.release()
