"""The parts the held root is made of: open flags, the file layer's errors and hints, applier's temp-file names, a
replaced file's metadata copied onto its successor, fsync, and the steps at a folder's descriptor: a regular file
opened for reading, a file created, a folder made, a tree walked, removed or pruned, never through a link;
io_failure words an OSError (exit 8)."""
from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from pathlib import Path

from applier.errors import IOFailure


O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NOCTTY = getattr(os, "O_NOCTTY", 0)
MAX_LINK_HOPS = 40          # as the kernel's own limit (ELOOP)
TEMP_SUFFIX = ".applier-tmp"
# The largest file applier reads: ComfyUI's and torch's sources are well below it (nodes.py ~100 kB); a journal blob
# holds one such file.
MAX_READ_BYTES = 64 * 1024 * 1024
# Every temp file a run creates carries this run's marker between the name and the suffix; the sweep removes only
# names of that exact shape (`.<name>.applier-<32 hex>.applier-tmp`), which no user file is named like by chance.
TEMP_MARKER = "applier-"

FILE_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
              stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link"}


def kind_of(mode: int) -> str:
    return FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")


def supported() -> bool:
    return os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and bool(O_NOFOLLOW)


class NotRegularFile(IOFailure):
    """A path applier must read or write is a FIFO, a device, a socket, or (where links are refused) a link."""


class LeadsOutside(NotRegularFile):
    """A path applier must use is, or passes through, a link leading outside the folder it must stay in."""


class FileTooLarge(IOFailure):
    """A file is larger than applier ever needs to read."""


def too_large(shown, size: int, limit: int) -> FileTooLarge:
    return FileTooLarge(f"refusing to read {shown}: {size} bytes or more, over applier's limit of {limit} bytes",
                        hint="nothing was changed; that is not a file applier wrote or patches")


class WalkLimit(NotRegularFile):
    """A tree applier walks is deeper or larger than any it makes."""


WALK_HINT = "nothing was changed; that is not a tree applier made: move the extra folders or files aside by hand"
SPECIAL_HINT = "nothing was changed; put a regular file in its place (or move it aside) and run the command again"
OUTSIDE_HINT = ("applier never reads or writes outside the install through a link; nothing more was changed. Put the "
                "folder or file itself in place of the link (or move the link aside) and run again")



def walk_at(top_fd: int, where: str, shown, max_depth: int, max_entries: int):
    """(folder's relpath, [(name, lstat)]) for the held folder top_fd (at where, closed here) and every real folder
    below it, breadth first, each opened from the one above it without following links (a link is listed, never
    entered). Iterative; WalkLimit past max_depth or max_entries (`shown` names the top)."""
    queue = [(top_fd, where, 0)]
    seen = 0
    try:
        while queue:
            fd, where, depth = queue.pop(0)
            try:
                entries = []
                for entry in os.scandir(fd):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    entries.append((entry.name, st))
                    seen += 1
                    if seen > max_entries:
                        raise WalkLimit(f"{shown} holds more than {max_entries} entries", hint=WALK_HINT)
                    if stat.S_ISDIR(st.st_mode):
                        if depth + 1 > max_depth:
                            raise WalkLimit(f"{shown} holds folders nested more than {max_depth} deep",
                                            hint=WALK_HINT)
                        try:
                            child = os.open(entry.name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=fd)
                        except OSError:
                            continue
                        queue.append((child, f"{where}/{entry.name}" if where else entry.name, depth + 1))
                yield where, entries
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in queue:
            os.close(fd)


def open_regular_at(fd: int, name: str, shown) -> int | None:
    """A blocking read-only fd of the regular file fd/name, looked at before it is opened: a FIFO, device or socket
    is refused unopened (NotRegularFile; `shown` names it); the open itself never blocks and never follows a link.
    None when a link stands there (swapped in after the walk: the caller walks again)."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"refusing to read {shown}: it is {kind_of(st.st_mode)}, not a regular file",
                             hint=SPECIAL_HINT)
    try:
        file_fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    st = os.fstat(file_fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(file_fd)
        raise NotRegularFile(f"refusing to read {shown}: it is {kind_of(st.st_mode)}, not a regular file",
                             hint=SPECIAL_HINT)
    os.set_blocking(file_fd, True)
    return file_fd


def create_at(fd: int, name: str, data: bytes, mode: int) -> bool:
    """Create fd/name with data unless something is there already (False then); no temp file, no link followed."""
    try:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode, dir_fd=fd)
    except FileExistsError:
        return False
    try:
        os.write(out, data)
    finally:
        os.close(out)
    return True


def make_folder_at(fd: int, name: str, mode: int, shown) -> None:
    """Create the folder fd/name unless a folder is there already (NotADirectoryError for anything else)."""
    try:
        os.mkdir(name, mode, dir_fd=fd)
    except FileExistsError:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(shown)) from None


def temp_name(name: str) -> str:
    return f".{name}.{TEMP_MARKER}{secrets.token_hex(16)}{TEMP_SUFFIX}"


def is_temp_name(name: str) -> bool:
    """Whether name is one applier's own temp files carry: `.<name>.applier-<32 hex>.applier-tmp`."""
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return False
    stem = name[:-len(TEMP_SUFFIX)]
    marker = stem.rsplit(".", 1)[-1]
    token = marker[len(TEMP_MARKER):]
    return (marker.startswith(TEMP_MARKER) and len(token) == 32 and all(c in "0123456789abcdef" for c in token)
            and len(stem) > len(marker) + 2)


def copy_metadata(old_fd: int | None, new_fd: int, mode: int | None) -> None:
    """The replaced file's access rights onto the new one: mode bits (setuid/setgid/sticky included), owner and
    group when running as root, extended attributes (POSIX ACLs live there on Linux). Without an old file: `mode`,
    or 0666 less the umask."""
    st = os.fstat(old_fd) if old_fd is not None else None
    if st is not None and os.geteuid() == 0:
        os.fchown(new_fd, st.st_uid, st.st_gid)     # before the chmod: chown clears setuid/setgid
    if mode is not None:
        os.fchmod(new_fd, mode)
    elif st is not None:
        os.fchmod(new_fd, stat.S_IMODE(st.st_mode))
    else:
        os.fchmod(new_fd, 0o666 & ~current_umask())
    if old_fd is not None and hasattr(os, "listxattr"):
        try:
            names = os.listxattr(old_fd)
        except OSError:
            names = []
        for attr in names:
            try:
                os.setxattr(new_fd, attr, os.getxattr(old_fd, attr))
            except OSError:
                continue        # e.g. security.* without the privilege: the rest is still kept
        if st is not None and mode is None:
            os.fchmod(new_fd, stat.S_IMODE(st.st_mode))   # an ACL written after the chmod may have moved the mask


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove parent/name and all below it with an explicit stack of held folders: no recursion, no link
    followed."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    stack = [(os.dup(parent_fd), name)]
    opened: list[tuple[int, int, str]] = []    # (fd of the folder, fd of its parent, its name)
    try:
        while stack:
            pfd, fname = stack.pop()
            try:
                fd = os.open(fname, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=pfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    os.unlink(fname, dir_fd=pfd)
                elif exc.errno != errno.ENOENT:
                    raise
                os.close(pfd)
                continue
            opened.append((fd, pfd, fname))
            for entry in os.scandir(fd):
                if entry.is_dir(follow_symlinks=False):
                    stack.append((os.dup(fd), entry.name))
                else:
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
        for fd, pfd, fname in reversed(opened):
            try:
                os.rmdir(fname, dir_fd=pfd)
            except FileNotFoundError:
                pass
    finally:
        for fd, pfd, _ in opened:
            os.close(fd)
            os.close(pfd)
        for pfd, _ in stack:
            os.close(pfd)


def prune_at(top_fd: int) -> None:
    """Remove every empty folder below the held folder top_fd, deepest first, iteratively."""
    order: list[tuple[int, str]] = []           # (parent fd, name), parents before children
    held = []
    queue = [top_fd]
    while queue:
        fd = queue.pop()
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                try:
                    child = os.open(entry.name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                held.append(child)
                order.append((fd, entry.name))
                queue.append(child)
    try:
        for pfd, name in reversed(order):
            try:
                if name == "__pycache__":
                    cache = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=pfd)
                    try:
                        entries = list(os.scandir(cache))
                        if all(e.name.endswith(".pyc") and e.is_file(follow_symlinks=False) for e in entries):
                            for e in entries:
                                os.unlink(e.name, dir_fd=cache)
                    finally:
                        os.close(cache)
                os.rmdir(name, dir_fd=pfd)
            except OSError:
                continue
    finally:
        for fd in held:
            os.close(fd)


NOTHING_CHANGED = "nothing was changed; fix the cause (permissions, free space) and run the command again"


def io_failure(exc: OSError, path: Path, action: str, *, hint: str = NOTHING_CHANGED) -> IOFailure:
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
    return IOFailure(f"cannot {action} {path}: {reason}", hint=hint)


def dump_json(data) -> bytes:
    """A JSON document as applier writes it: indented, UTF-8, one trailing newline."""
    return (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")
