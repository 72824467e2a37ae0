"""One applier run at a time per target: a lock file in the state folder, opened through the folder's held handle
(never through a link: a lock file swapped for a link is refused, not truncated or created where it points)."""
from __future__ import annotations

import errno
import os
import time
from contextlib import contextmanager

from applier.errors import LockedError, StateCorruptError
from applier.settings import lock_timeout
from applier.store.fsutil import io_failure
from applier.store.heldroot import supported
from applier.store.state import StateStore

try:
    import fcntl
except ImportError:         # Windows: filelock's own lock, by path
    fcntl = None

DEFAULT_TIMEOUT_S = 5.0
READER_TIMEOUT_S = 30.0     # a read-only command waits out a run in flight rather than fail beside it
POLL_S = 0.05


@contextmanager
def target_lock(store: StateStore, timeout: float | None = None, *, reader: bool = False):
    """Hold the target's lock; wait briefly for another run (readers longer), then fail with LockedError. The
    state folder is checked first (no link, no special file: exit 7) and created inside the install, never above
    it: a deleted install is not recreated."""
    if timeout is None:
        timeout = lock_timeout(READER_TIMEOUT_S if reader else DEFAULT_TIMEOUT_S)
    state_dir = store.dir
    store.check_roots()
    try:
        store.ensure()
    except OSError as exc:
        raise io_failure(exc, state_dir, "create the state folder") from exc
    if fcntl is None or not supported():
        with path_lock(store, timeout):
            yield
        return
    fd = open_lock_file(store)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise io_failure(exc, store.lock_file, "take the lock in") from exc
            if time.monotonic() >= deadline:
                raise LockedError(f"another applier run holds the lock on {state_dir.parent} (waited {timeout:g} s)",
                                  hint="wait for it to finish; if none is running, the lock is released "
                                       "automatically when its process ends")
            time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def open_lock_file(store: StateStore) -> int:
    """The lock file's fd, opened (created 0600 when absent) in the held state folder without following a link."""
    held = store.held(create=True)
    try:
        return held.open_flags(store.guard(store.lock_file), os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateCorruptError(f"{store.lock_file} is a symbolic link",
                                    hint="nothing was changed; move it aside by hand") from exc
        raise io_failure(exc, store.dir, "take the lock in") from exc


@contextmanager
def path_lock(store: StateStore, timeout: float):
    """Where the platform has no dir_fd or flock: filelock's lock by path (the README's safety section says what
    is weaker there)."""
    from filelock import FileLock, Timeout    # only where it is used: POSIX never needs it
    lock_path = store.dir / store.guard(store.lock_file)
    try:
        lock = FileLock(str(lock_path))
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise LockedError(f"another applier run holds the lock on {store.dir.parent} (waited {timeout:g} s)",
                          hint="wait for it to finish; if none is running, the lock is released automatically "
                               "when its process ends") from exc
    except OSError as exc:
        raise io_failure(exc, store.dir, "take the lock in") from exc
    try:
        yield
    finally:
        lock.release()
