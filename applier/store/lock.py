"""One applier run at a time per target: an flock on the lock file of the state folder. The state store opens that
file through the folder's held handle (never through a link: a lock file swapped for a link is refused, not
truncated or created where it points) and hands the descriptor here (StateStore.locked).

The holder writes who it is into the lock file while it holds it (one JSON line: pid, host, command, since; emptied
on release, best effort: a full disk only leaves it empty), so that a run that waits in vain can say who holds the
lock, and whether that process still runs (a holder that no longer runs left the lock to a process it started)."""
from __future__ import annotations

import errno
import json
import os
import shlex
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from applier.errors import LockedError, StateCorruptError
from applier.settings import lock_timeout
from applier.store.fsutil import io_failure
from applier.store.fileops import NotRegularFile, supported

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
                raise locked_error(lock_file, timeout, read_holder(fd))
            time.sleep(POLL_S)
        write_holder(fd, holder_record())
        try:
            yield
        finally:
            write_holder(fd, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


MAX_HOLDER_BYTES = 4096
MAX_COMMAND_CHARS = 300


def holder_record() -> dict:
    """Who holds the lock: this process, its host, its command line (as the user typed it), since when (UTC)."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "applier"
    if program in ("__main__.py", "-m", "-c", "") or program.startswith("applier"):
        program = "applier"
    command = shlex.join([program, *sys.argv[1:]])
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command[:MAX_COMMAND_CHARS],
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_holder(fd: int, record: dict | None) -> None:
    """The lock file's content: record as one JSON line, or nothing (released). Best effort: the lock is the flock,
    never its content, so a write that fails (a full disk) changes nothing."""
    try:
        os.ftruncate(fd, 0)
        if record is not None:
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
    except OSError:
        pass


def read_holder(fd: int) -> dict | None:
    """The holder the lock file names, its fields checked (the file is anyone's who can write the folder: only
    plain values of bounded length are shown); None when it names none."""
    try:
        data = json.loads(os.pread(fd, MAX_HOLDER_BYTES, 0).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or type(data.get("pid")) is not int or data["pid"] <= 0:
        return None
    out = {"pid": data["pid"]}
    for key, limit in (("host", 255), ("command", MAX_COMMAND_CHARS), ("since", 40)):
        value = data.get(key)
        out[key] = value if isinstance(value, str) and value.isprintable() and len(value) <= limit else None
    return out


def holder_runs(holder: dict) -> bool | None:
    """Whether the holder's process still runs: None when it is on another host (that cannot be told from here)."""
    if holder.get("host") != socket.gethostname():
        return None
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextmanager
def take(open_fd, lock_file: Path, *, reader: bool = False, timeout: float | None = None):
    """hold() on the descriptor open_fd() opens (the lock file, through the state folder's handle) where the lock is
    by descriptor, else filelock's lock on lock_file by path."""
    with hold(open_lock_file(open_fd, lock_file) if by_descriptor() else None, lock_file, reader=reader,
              timeout=timeout):
        yield


def open_lock_file(open_fd, lock_file: Path) -> int:
    """open_fd(): the lock file's descriptor, opened (created 0600 when absent) without following a link; a link or
    a special file there is a refusal (exit 7), any other failure exit 8."""
    try:
        return open_fd()
    except NotRegularFile as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateCorruptError(f"{lock_file} is a symbolic link",
                                    hint="nothing was changed; move it aside by hand") from exc
        raise io_failure(exc, lock_file.parent, "take the lock in") from exc


def locked_error(lock_file: Path, timeout: float, holder: dict | None = None) -> LockedError:
    """Exit 4, saying who holds the lock (as the lock file names it) and whether that process still runs."""
    waited = f"another applier run holds the lock on {lock_file.parent.parent} (waited {timeout:g} s)"
    if holder is None:
        return LockedError(f"{waited}; the lock file names no holder (an older applier, or a run just starting)",
                           hint="wait for it to finish; the lock is released when its process ends")
    who = (f"pid {holder['pid']} on {holder['host'] or 'an unnamed host'}, `{holder['command'] or '?'}`, since "
           f"{holder['since'] or 'an unknown time'}")
    runs = holder_runs(holder)
    if runs is False:
        return LockedError(f"{waited}: {who}; that process no longer runs (stale): a process it started still holds "
                           "the lock", hint=f"end what holds {lock_file} (`fuser -v {lock_file}` lists it); the lock "
                                            "is released when it ends, and the next command finishes any run cut short")
    where = "" if runs else " (on another host: whether it still runs cannot be told from here)"
    return LockedError(f"{waited}: {who}{where}",
                       hint=f"wait for it to finish, or end it (kill {holder['pid']}); the lock is released when its "
                            "process ends, and the next command finishes any run cut short")


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
