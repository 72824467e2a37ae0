"""Bytes on disk: bounded reads of regular files only, writes that never leave a torn file (temp file in the same
folder, fsync, os.replace), and the no-link discipline of applier's own folder (`check_no_links`).

Every read looks before it opens: what is not a regular file (FIFO, device, socket: /dev/zero would be read until
memory runs out, and opening some devices does something) is refused unopened; the open itself does not block (a
FIFO swapped in meanwhile would otherwise hang the command) and the opened file is checked again; reads stop at a
size cap. `read_inside` also refuses a file that a link leads outside the folder it must stay in."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from applier.errors import IOFailure
from applier.paths import real_inside

# Temp files are `.<name>.<random>.applier-tmp` beside the file they replace: recovery finds and removes them.
TEMP_SUFFIX = ".applier-tmp"
# The largest file applier reads: ComfyUI's and torch's sources are well below it (nodes.py ~100 kB); a journal blob
# holds one such file.
MAX_READ_BYTES = 64 * 1024 * 1024

FILE_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
              stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link"}


class NotRegularFile(IOFailure):
    """A path applier must read or write is a FIFO, a device, a socket, or (where links are refused) a link."""


class FileTooLarge(IOFailure):
    """A file is larger than applier ever needs to read."""


class LeadsOutside(NotRegularFile):
    """A path applier must read is, or passes through, a link leading outside the folder the read must stay in."""


def kind_of(mode: int) -> str:
    return FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    """Hex sha256 of the file, None when it does not exist."""
    data = read_bytes_or_none(path)
    return None if data is None else sha256_bytes(data)


def read_regular(path: Path, *, limit: int = MAX_READ_BYTES, follow_links: bool = True) -> bytes:
    """The bytes of a regular file, opened without blocking and read up to `limit`. FileNotFoundError when it does
    not exist; NotRegularFile for a FIFO, device, socket or folder (and for a link when follow_links is False);
    FileTooLarge past the limit; other OSErrors as they come."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    # Look before opening: a device is never opened (opening one can act: a watchdog arms, a tape rewinds), a FIFO
    # never waited on. The fstat below catches what is swapped in between.
    seen = os.stat(path) if follow_links else os.lstat(path)
    if stat.S_ISLNK(seen.st_mode):
        raise NotRegularFile(f"refusing to read {path}: it is a symbolic link",
                             hint="applier never follows links in its own folder; move the link aside")
    if stat.S_ISDIR(seen.st_mode):
        raise NotRegularFile(f"refusing to read {path}: it is a folder", hint=SPECIAL_HINT)
    if not stat.S_ISREG(seen.st_mode):
        raise NotRegularFile(f"refusing to read {path}: it is {kind_of(seen.st_mode)}, not a regular file",
                             hint=SPECIAL_HINT)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise NotRegularFile(f"refusing to read {path}: it is a symbolic link",
                                 hint="applier never follows links in its own folder; move the link aside") from exc
        if exc.errno == errno.EISDIR:
            raise NotRegularFile(f"refusing to read {path}: it is a folder", hint=SPECIAL_HINT) from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"refusing to read {path}: it is {kind_of(st.st_mode)}, not a regular file",
                                 hint=SPECIAL_HINT)
        if st.st_size > limit:
            raise too_large(path, st.st_size, limit)
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise too_large(path, total, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


SPECIAL_HINT = "nothing was changed; put a regular file in its place (or move it aside) and run the command again"


def read_inside(top: Path, path: Path, *, limit: int = MAX_READ_BYTES) -> bytes:
    """read_regular of a file that really lies inside top: links on its way may lead anywhere inside top, never out
    of it (LeadsOutside, naming where it leads, before anything is opened there). The resolved path is what is
    opened, its last step without following a link, so a link swapped in meanwhile is refused too."""
    real = Path(os.path.realpath(path))
    if not real_inside(top, real):
        raise LeadsOutside(f"refusing to read {path}: it is a link leading outside {top} (to {real})",
                           hint="applier reads nothing outside the install through a link; nothing was changed")
    return read_regular(real, limit=limit, follow_links=False)


def too_large(path: Path, size: int, limit: int) -> FileTooLarge:
    return FileTooLarge(f"refusing to read {path}: {size} bytes or more, over applier's limit of {limit} bytes",
                        hint="nothing was changed; that is not a file applier wrote or patches")


def _none_if_absent(read, path: Path) -> bytes | None:
    """read(), None when the file does not exist; any other OSError as an IOFailure (exit 8)."""
    try:
        return read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IOFailure:
        raise
    except OSError as exc:
        raise io_failure(exc, path, "read") from exc


def read_bytes_or_none(path: Path, *, limit: int = MAX_READ_BYTES) -> bytes | None:
    """The bytes of a regular file (links followed: confinement checked where they lead), None when it does not
    exist; IOFailure (exit 8) when it cannot be read, is special, or is too large."""
    return _none_if_absent(lambda: read_regular(path, limit=limit), path)


def read_inside_or_none(top: Path, path: Path, *, limit: int = MAX_READ_BYTES) -> bytes | None:
    """read_inside, None when the file does not exist; IOFailure (exit 8) when it cannot be read, is special, is
    too large or is a link leading out of top."""
    return _none_if_absent(lambda: read_inside(top, path, limit=limit), path)


def check_no_links(top: Path, path: Path | None = None) -> None:
    """Refuse (NotRegularFile) unless `top` is a real folder and every component from top down to `path` (default:
    top itself) is a real folder or, last, a regular file, or does not exist yet. Nothing is followed: each step
    is an lstat, so a link planted inside applier's folder can never lead a write or a removal outside it."""
    top = Path(top)
    steps = [top]
    if path is not None:
        rel = Path(path).relative_to(top)
        for part in rel.parts:
            steps.append(steps[-1] / part)
    for n, step in enumerate(steps):
        try:
            st = os.lstat(step)
        except (FileNotFoundError, NotADirectoryError):
            return
        last = n == len(steps) - 1
        if stat.S_ISDIR(st.st_mode) or (last and n and stat.S_ISREG(st.st_mode)):
            continue
        raise NotRegularFile(f"{step} is {kind_of(st.st_mode)}: applier refuses to follow links or use special "
                             f"files inside {top}", hint="nothing was changed; move it aside by hand (a link "
                                                         "there could lead a write outside the install)")


def scan_no_links(top: Path) -> None:
    """check_no_links for everything below top: every entry a real folder or a regular file (os.walk never
    follows links; an entry removed meanwhile is skipped)."""
    check_no_links(top)
    for folder, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise NotRegularFile(f"{path} is {kind_of(st.st_mode)}: applier refuses to follow links or use "
                                     f"special files inside {top}",
                                     hint="nothing was changed; move it aside by hand (a link there could lead a "
                                          "write outside the install)")


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
        errno.ELOOP: "a symbolic link on the way loops (or too many links lead there)",
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
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"refusing to replace {like}: it is {kind_of(st.st_mode)}", hint=SPECIAL_HINT)
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
    try:
        is_folder = stat.S_ISDIR(os.lstat(cache).st_mode)
    except OSError:
        is_folder = False
    if is_folder:   # a real folder: a __pycache__ that is a link is never followed (it may lead anywhere)
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            try:
                pyc.unlink()
                removed.append(pyc)
            except FileNotFoundError:
                pass
    return removed


def remove_tree(path: Path) -> None:
    """Remove a folder and everything in it, never through a link: a link in its place is unlinked, links inside
    are removed as links (shutil.rmtree's fd-based walk), a missing folder is nothing to do."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        remove_file(path)
        return
    shutil.rmtree(path, ignore_errors=True)


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
    while not os.path.lexists(folder) and folder.parent != folder:  # folders a new file needs are created
        folder = folder.parent
    if not folder.is_dir():     # a file (or a link to nothing) where a folder must be: not a permission problem
        raise io_failure(NotADirectoryError(errno.ENOTDIR, "not a folder"), folder, "write into")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise io_failure(PermissionError(errno.EACCES, "permission denied"), folder, "write into")
    if path.exists() and not os.access(path, os.R_OK):
        raise io_failure(PermissionError(errno.EACCES, "permission denied"), path, "read")
