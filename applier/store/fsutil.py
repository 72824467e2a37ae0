"""Bytes on disk: bounded reads of regular files only, reads kept inside a folder (through a held handle), atomic
writes outside any install, stale bytecode removal.

Every read looks before it opens: what is not a regular file (FIFO, device, socket: /dev/zero would be read until
memory runs out, and opening some devices does something) is refused unopened; the open itself does not block (a
FIFO swapped in meanwhile would otherwise hang the command) and the opened file is checked again; reads stop at a
size cap. `read_inside` also refuses a file that a link leads outside the folder it must stay in."""
from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from applier.errors import IOFailure
from applier.store.fileops import (MAX_READ_BYTES, SPECIAL_HINT, TEMP_SUFFIX, FileTooLarge, LeadsOutside,
                                   NotRegularFile, dump_json, io_failure, kind_of)
from applier.store.heldroot import HeldRoot, hold, read_fd
from applier.store.paths import real_inside

# Walks of applier's own folder and of the pack's install folders stop here (exit 7 / a refusal): applier writes
# a few levels and a few thousand files; 1,200 nested folders or a million files are none of its making.
MAX_WALK_DEPTH = 64
MAX_WALK_ENTRIES = 200_000

__all__ = ["MAX_READ_BYTES", "TEMP_SUFFIX", "FileTooLarge", "HeldRoot", "LeadsOutside", "NotRegularFile", "dump_json",
           "hold", "io_failure", "kind_of"]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()




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
        os.set_blocking(fd, True)
        return read_fd(fd, path, limit)
    finally:
        os.close(fd)


def read_inside(top: Path, path: Path, *, limit: int = MAX_READ_BYTES) -> bytes:
    """read_regular of a file that really lies inside top, walked from a handle on top (heldroot): links on its way
    may lead anywhere inside top, never out of it (LeadsOutside, before anything is opened there), and a link swapped
    in meanwhile is walked by the same rules, never followed by the kernel."""
    path, top = Path(path), Path(top)
    real = Path(os.path.realpath(path))
    if not real_inside(top, real):      # refused before anything is opened; the walk below refuses a late swap
        raise outside_read(top, path)
    try:
        rel = path.relative_to(top)
    except ValueError:
        rel = real.relative_to(Path(os.path.realpath(top)))
    held = hold(top)
    try:
        return held.read(rel.as_posix(), limit=limit)
    except LeadsOutside:
        raise outside_read(top, path) from None
    except IsADirectoryError as exc:
        raise NotRegularFile(f"refusing to read {path}: it is a folder", hint=SPECIAL_HINT) from exc
    finally:
        held.close()


def outside_read(top: Path, path: Path) -> LeadsOutside:
    return LeadsOutside(f"refusing to read {path}: it is a link leading outside {top} (to {os.path.realpath(path)})",
                        hint="applier reads nothing outside the install through a link; nothing was changed")


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




def read_inside_or_none(top: Path, path: Path, *, limit: int = MAX_READ_BYTES) -> bytes | None:
    """read_inside, None when the file does not exist; IOFailure (exit 8) when it cannot be read, is special, is
    too large or is a link leading out of top."""
    return _none_if_absent(lambda: read_inside(top, path, limit=limit), path)




def atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace path with data atomically (HeldRoot.write on its folder: temp file, fsync, rename; a new inode; the
    replaced file's mode, owner and extended attributes kept). For files outside any install (catalog authoring):
    inside an install every write goes through the install's own held handle."""
    path = Path(path)
    held = hold(path.parent)
    try:
        held.write(path.name, data, mode=mode)
    finally:
        held.close()






def remove_stale_bytecode(path: Path) -> list[Path]:
    """HeldRoot.remove_stale_bytecode for a path, the folder holding it held for the call."""
    path = Path(path)
    held = hold(path.parent)
    try:
        return [path.parent / rel for rel in held.remove_stale_bytecode(path.name)]
    finally:
        held.close()


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
