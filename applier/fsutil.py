"""File operations that never leave a torn file: temp file in the same folder, fsync, os.replace."""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from applier.errors import IOFailure

# Temp files are `.<name>.<random>.applier-tmp` beside the file they replace: recovery finds and removes them.
TEMP_SUFFIX = ".applier-tmp"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    """Hex sha256 of the file, None when it does not exist."""
    try:
        return sha256_bytes(Path(path).read_bytes())
    except FileNotFoundError:
        return None


def read_bytes_or_none(path: Path) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise io_failure(exc, path, "read") from exc


def io_failure(exc: OSError, path: Path, action: str) -> IOFailure:
    reason = {
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOSPC: "no space left on the device",
        errno.EROFS: "read-only file system",
        errno.EDQUOT: "disk quota exceeded",
        errno.EFBIG: "file too large",
        errno.ENOTDIR: "a folder on the way is a file",
        errno.EISDIR: "it is a folder",
    }.get(exc.errno, exc.strerror or str(exc))
    return IOFailure(f"cannot {action} {path}: {reason}",
                     hint="nothing was changed; fix the cause (permissions, free space) and run the command again")


def atomic_write(path: Path, data: bytes, *, like: Path | None = None, mode: int | None = None) -> None:
    """Replace path with data atomically. A new inode is written, never the old one in place: uv hardlinks
    site-packages files into its cache, and an in-place write would corrupt every linked copy.

    The mode (and the owner when running as root) is copied from `like` (default: the file being replaced)."""
    path = Path(path)
    like = Path(like) if like is not None else path
    try:
        st = like.stat()
    except FileNotFoundError:
        st = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        else:
            os.chmod(tmp, 0o666 & ~current_umask())
        if st is not None and os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_file(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(Path(path).parent)


def remove_stale_bytecode(path: Path) -> list[Path]:
    """Delete __pycache__/<stem>.*.pyc of a rewritten .py file: a timestamp pyc written in the same second as a
    same-size edit, or a hash-based pyc that is never revalidated, would keep the old code running."""
    path = Path(path)
    if path.suffix != ".py":
        return []
    cache = path.parent / "__pycache__"
    removed = []
    if cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            try:
                pyc.unlink()
                removed.append(pyc)
            except FileNotFoundError:
                pass
    return removed


def subfolders(top: Path) -> list[Path]:
    """top and every folder below it, symlinks not followed. A folder another process removes meanwhile (a
    concurrent run tidying .applier/) is skipped, never an error: os.walk ignores what it cannot list."""
    top = Path(top)
    if not top.is_dir() or top.is_symlink():
        return []
    return [Path(folder) for folder, _, _ in os.walk(top)]


def check_writable(path: Path) -> None:
    """Raise IOFailure now (before any change) when path's folder cannot take a new file or path cannot be read."""
    path = Path(path)
    folder = path.parent
    while not folder.exists() and folder.parent != folder:  # folders a new file needs are created on the way
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise io_failure(PermissionError(errno.EACCES, "permission denied"), folder, "write into")
    if path.exists() and not os.access(path, os.R_OK):
        raise io_failure(PermissionError(errno.EACCES, "permission denied"), path, "read")
