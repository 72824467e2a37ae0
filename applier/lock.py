"""One applier run at a time per target: a file lock in the state folder."""
from __future__ import annotations

import os
from contextlib import contextmanager

from filelock import FileLock, Timeout

from applier.errors import LockedError
from applier.fsutil import io_failure
from applier.state import StateStore

DEFAULT_TIMEOUT_S = 5.0
READER_TIMEOUT_S = 30.0     # a read-only command waits out a run in flight rather than fail beside it


@contextmanager
def target_lock(store: StateStore, timeout: float | None = None, *, reader: bool = False):
    """Hold the target's lock; wait briefly for another run (readers longer), then fail with LockedError. The
    state folder is checked first (no link, no special file: exit 7) and created inside the install, never above
    it: a deleted install is not recreated."""
    if timeout is None:
        default = READER_TIMEOUT_S if reader else DEFAULT_TIMEOUT_S
        timeout = float(os.environ.get("APPLIER_LOCK_TIMEOUT", default))
    state_dir = store.dir
    store.check_roots()
    try:
        store.ensure()
    except OSError as exc:
        raise io_failure(exc, state_dir, "create the state folder") from exc
    lock_path = store.guard(store.lock_file)
    try:
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
