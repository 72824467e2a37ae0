"""One applier run at a time per target: an flock on the lock file of the state folder. The state store opens that
file through the folder's held handle (never through a link: a lock file swapped for a link is refused, not
truncated or created where it points) and hands the descriptor here (StateStore.locked)."""
from __future__ import annotations

import errno
import os
import time
from contextlib import contextmanager
from pathlib import Path

from applier.errors import LockedError
from applier.settings import lock_timeout
from applier.store.fsutil import io_failure
from applier.store.heldroot import supported

try:
    import fcntl
except ImportError:         # Windows: filelock's own lock, by path
    fcntl = None

DEFAULT_TIMEOUT_S = 5.0
READER_TIMEOUT_S = 30.0     # a read-only command waits out a run in flight rather than fail beside it
POLL_S = 0.05


def by_descriptor() -> bool:
    """Whether the lock is an flock on a descriptor opened through the folder's held handle (POSIX), else
    filelock's lock by path."""
    return fcntl is not None and supported()


@contextmanager
def hold(fd: int | None, lock_file: Path, *, reader: bool = False, timeout: float | None = None):
    """Hold the lock on `fd` (the lock file opened by the state store, closed here), or where the platform has no
    descriptors to lock (fd None) filelock's lock on `lock_file` by path. Waits briefly for another run (readers
    longer), then fails with LockedError."""
    if timeout is None:
        timeout = lock_timeout(READER_TIMEOUT_S if reader else DEFAULT_TIMEOUT_S)
    if fd is None:
        with path_lock(lock_file, timeout):
            yield
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise io_failure(exc, lock_file, "take the lock in") from exc
            if time.monotonic() >= deadline:
                raise locked_error(lock_file, timeout)
            time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def take(open_fd, lock_file: Path, *, reader: bool = False, timeout: float | None = None):
    """hold() on the descriptor open_fd() opens (the lock file, through the state folder's handle) where the lock is
    by descriptor, else filelock's lock on lock_file by path."""
    with hold(open_fd() if by_descriptor() else None, lock_file, reader=reader, timeout=timeout):
        yield


def locked_error(lock_file: Path, timeout: float) -> LockedError:
    return LockedError(f"another applier run holds the lock on {lock_file.parent.parent} (waited {timeout:g} s)",
                       hint="wait for it to finish; if none is running, the lock is released automatically when "
                            "its process ends")


@contextmanager
def path_lock(lock_file: Path, timeout: float):
    """Where the platform has no dir_fd or flock: filelock's lock by path (the README's safety section says what
    is weaker there)."""
    from filelock import FileLock, Timeout    # only where it is used: POSIX never needs it
    try:
        lock = FileLock(str(lock_file))
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise locked_error(lock_file, timeout) from exc
    except OSError as exc:
        raise io_failure(exc, lock_file.parent, "take the lock in") from exc
    try:
        yield
    finally:
        lock.release()
