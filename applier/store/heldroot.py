"""A folder held open as a directory handle, every operation below it walked one component at a time from that
handle: in the spirit of Go's `os.Root` and systemd's `chase()`.

A path checked at one moment and written by name at the next can be turned into a link meanwhile, and the kernel
would follow it. Here nothing below the root is ever resolved by the kernel from a path string: each folder on the
way is opened relative to the one before it with O_NOFOLLOW | O_DIRECTORY, and the last step (open, create,
rename, unlink, mkdir, stat) is a `*at` call on the held parent. A link met on the way is resolved by this module's
own rules, never by the kernel's:

    relative target      followed from the folder holding the link; `..` may climb, never above the root
    absolute target      followed only when it names a place inside the root (its real path, taken at open)
    anything else        LeadsOutside, before anything there is opened

A link whose target stays inside keeps working (a `nodes.py` that is a link to a file inside the install is written
through); with `links=False` (applier's own `.applier/`) every link is a refusal. A link swapped in after the walk
is never written through: the final step is a rename onto the held parent or an O_NOFOLLOW open, which act on the
link itself or fail.

Where the platform lacks `dir_fd` (Windows), `supported()` is False and callers fall back to path operations with
a check before each step: a race there can still lead outside (the README's safety section says so).

The last section is the one writer of a run (`carry_out`): the journal plans a run whole, as data (a `Run`: the
backups, journal.json and its blobs, each target file as a Place with its old and new bytes, the state to record),
and carry_out writes it through these handles in that order, all or nothing; nothing else writes a run."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from applier.errors import BadTargetError, IOFailure, StateCorruptError
from applier.store.failpoints import HOOK_NAMES, HOOKS, failpoint

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


def read_fd(fd: int, shown, limit: int) -> bytes:
    """The bytes of an open regular file, at most limit (FileTooLarge past it; `shown` names it)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise too_large(shown, size, limit)
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise too_large(shown, total, limit)
    return b"".join(chunks)


def too_large(shown, size: int, limit: int) -> FileTooLarge:
    return FileTooLarge(f"refusing to read {shown}: {size} bytes or more, over applier's limit of {limit} bytes",
                        hint="nothing was changed; that is not a file applier wrote or patches")


class WalkLimit(NotRegularFile):
    """A tree applier walks is deeper or larger than any it makes."""


WALK_HINT = "nothing was changed; that is not a tree applier made: move the extra folders or files aside by hand"
SPECIAL_HINT = "nothing was changed; put a regular file in its place (or move it aside) and run the command again"
OUTSIDE_HINT = ("applier never reads or writes outside the install through a link; nothing more was changed. Put the "
                "folder or file itself in place of the link (or move the link aside) and run again")


def parts_of(relpath) -> tuple[str, ...]:
    """The components of a relative path ('' and '.' dropped); ValueError for an absolute path or a NUL."""
    text = relpath.as_posix() if isinstance(relpath, PurePosixPath) else str(relpath)
    if "\x00" in text or text.startswith("/"):
        raise ValueError(f"not a relative path: {text!r}")
    return tuple(p for p in text.split("/") if p not in ("", "."))


class HeldRoot:
    """One folder, opened once; every operation below it by relative path, walked from the handle."""

    def __init__(self, path: Path, *, links: bool = True):
        self.path = Path(path)
        self.links = links
        self.fd = os.open(self.path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)
        self.real = Path(os.path.realpath(self.path))

    @classmethod
    def from_fd(cls, fd: int, path: Path, *, links: bool = True) -> "HeldRoot":
        """A handle on a folder already opened (the fd becomes the handle's); path is for messages."""
        held = cls.__new__(cls)
        held.path, held.links, held.fd = Path(path), links, fd
        st = os.fstat(fd)
        held.identity = (st.st_dev, st.st_ino)
        held.real = Path(os.path.realpath(held.path))
        return held

    def __deepcopy__(self, memo):     # a record holding a handle is copied with the same handle
        return self

    def __repr__(self) -> str:
        return f"HeldRoot({str(self.path)!r})"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except (OSError, AttributeError):
            pass

    def display(self, rel) -> Path:
        return self.path.joinpath(*parts_of(rel))

    # ------------------------------------------------------------------ the walk

    def walk_to(self, rel, *, follow_last: bool = True, create_folders: bool = False) -> tuple[int, str, tuple]:
        """(an fd of the folder holding the last component, its name, its path from the root after links) for rel.
        The fd is the caller's to close. The last component may not exist; a folder on the way that does not exist
        is created with create_folders (else FileNotFoundError). LeadsOutside for a link leading out of the root
        (or any link where links are refused); an empty rel is refused (the root itself has no parent here)."""
        todo = list(parts_of(rel))
        if not todo:
            raise IsADirectoryError(errno.EISDIR, "the root itself", str(self.path))
        fds = [os.dup(self.fd)]
        where: list[str] = []
        hops = 0
        try:
            while True:
                name = todo.pop(0)
                last = not todo
                if name == "..":
                    if not where:
                        raise self.outside(rel, "'..' climbs above the root")
                    os.close(fds.pop())
                    where.pop()
                    if last:
                        raise IsADirectoryError(errno.EISDIR, "a folder", str(self.display(rel)))
                    continue
                try:
                    st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return self.hand_over(fds, name, where)
                    if not create_folders:
                        raise
                    try:
                        os.mkdir(name, 0o777, dir_fd=fds[-1])
                    except FileExistsError:
                        pass
                    todo.insert(0, name)
                    continue
                if stat.S_ISLNK(st.st_mode):
                    if not self.links:
                        raise NotRegularFile(
                            f"{self.display([*where, name])} is a symbolic link: applier refuses to follow links "
                            f"inside {self.path}", hint="nothing was changed; move it aside by hand (a link there "
                                                        "could lead a write outside the install)")
                    if last and not follow_last:
                        return self.hand_over(fds, name, where)
                    hops += 1
                    if hops > MAX_LINK_HOPS:
                        raise OSError(errno.ELOOP, "too many links", str(self.display(rel)))
                    target = os.readlink(name, dir_fd=fds[-1])
                    if target.startswith("/"):
                        inside = self.inside_parts(target)
                        if inside is None:
                            raise self.outside(rel, f"a link leads to {target}")
                        for fd in fds[1:]:
                            os.close(fd)
                        del fds[1:]
                        where.clear()
                        todo[:0] = list(inside)
                    else:
                        todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
                    if not todo:        # a link to the root itself
                        raise IsADirectoryError(errno.EISDIR, "a folder", str(self.display(rel)))
                    continue
                if last:
                    return self.hand_over(fds, name, where)
                if not stat.S_ISDIR(st.st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, "a folder on the way is a file",
                                             str(self.display([*where, name])))
                try:
                    fd = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=fds[-1])
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                        todo.insert(0, name)     # swapped meanwhile: look at it again
                        hops += 1
                        if hops > MAX_LINK_HOPS:
                            raise
                        continue
                    raise
                fds.append(fd)
                where.append(name)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    @staticmethod
    def hand_over(fds: list[int], name: str, where: list[str]) -> tuple[int, str, tuple]:
        for fd in fds[:-1]:
            os.close(fd)
        return fds[-1], name, (*where, name)

    def inside_parts(self, target: str) -> tuple[str, ...] | None:
        """The parts of an absolute link target below the root, None when it is not inside the root."""
        pure = PurePosixPath(target)
        for base in (self.real, self.path):
            try:
                return parts_of(pure.relative_to(PurePosixPath(base)))
            except ValueError:
                continue
        return None

    def outside(self, rel, why: str) -> LeadsOutside:
        return LeadsOutside(f"refusing to use {self.display(rel)}: {why}, outside {self.path}", hint=OUTSIDE_HINT)

    def resolved(self, rel) -> tuple[str, ...]:
        """The path of rel from the root once every link on its way (the last one included) is followed."""
        fd, _, where = self.walk_to(rel)
        os.close(fd)
        return where

    # ------------------------------------------------------------------ reads

    def lstat(self, rel) -> os.stat_result | None:
        """The stat of rel's last component itself (a link is not followed), None when it does not exist."""
        return self.stat(rel, follow_last=False)

    def stat(self, rel, *, follow_last: bool = True) -> os.stat_result | None:
        """The stat of what rel leads to, links followed inside the root; None when it does not exist."""
        try:
            fd, name, _ = self.walk_to(rel, follow_last=follow_last)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def open_file(self, rel) -> int:
        """A read-only fd of the regular file rel leads to (links followed inside the root). Looked at before it is
        opened: a FIFO, device or socket is refused unopened; the open itself never blocks and never follows a link
        swapped in meanwhile (that is walked again)."""
        for _ in range(MAX_LINK_HOPS):
            fd, name, where = self.walk_to(rel)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    continue        # a link swapped in after the walk: walk again
                if not stat.S_ISREG(st.st_mode):
                    raise NotRegularFile(f"refusing to read {self.display(where)}: it is {kind_of(st.st_mode)}, "
                                         "not a regular file", hint=SPECIAL_HINT)
                try:
                    file_fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC,
                                      dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        continue
                    raise
            finally:
                os.close(fd)
            st = os.fstat(file_fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(file_fd)
                raise NotRegularFile(f"refusing to read {self.display(where)}: it is {kind_of(st.st_mode)}, not a "
                                     "regular file", hint=SPECIAL_HINT)
            os.set_blocking(file_fd, True)
            return file_fd
        raise OSError(errno.ELOOP, "links keep changing", str(self.display(rel)))

    def read(self, rel, *, limit: int) -> bytes:
        """The bytes of the regular file rel leads to, at most limit (FileTooLarge past it)."""
        fd = self.open_file(rel)
        try:
            return read_fd(fd, self.display(rel), limit)
        finally:
            os.close(fd)

    def listdir(self, rel=()) -> list[str]:
        """The names in the folder rel leads to (links followed inside the root); [] when it is not a folder."""
        try:
            fd = self.open_folder(rel)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def open_folder(self, rel, *, follow_last: bool = True) -> int:
        """An fd of the folder rel leads to (the root itself for an empty rel), links followed inside the root
        (without follow_last, a link as the last step is NotADirectoryError)."""
        if not parts_of(rel):
            return os.dup(self.fd)
        fd, name, where = self.walk_to(rel, follow_last=follow_last)
        try:
            return os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotADirectoryError(errno.ENOTDIR, "a link swapped in", str(self.display(where))) from exc
            raise
        finally:
            os.close(fd)

    def walk(self, rel="", *, max_depth: int, max_entries: int):
        """(folder's relpath, [(name, lstat)]) for the folder rel leads to and every real folder below it, breadth
        first, each opened from the one above it without following links (a link below rel is listed, never
        entered). Iterative; WalkLimit past max_depth or max_entries. Nothing there yields nothing."""
        try:
            top = self.open_folder(rel)
        except (FileNotFoundError, NotADirectoryError):
            return
        queue = [(top, "/".join(parts_of(rel)), 0)]
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
                            raise WalkLimit(f"{self.display(rel)} holds more than {max_entries} entries",
                                            hint=WALK_HINT)
                        if stat.S_ISDIR(st.st_mode):
                            if depth + 1 > max_depth:
                                raise WalkLimit(f"{self.display(rel)} holds folders nested more than {max_depth} "
                                                "deep", hint=WALK_HINT)
                            try:
                                child = os.open(entry.name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                                                dir_fd=fd)
                            except OSError:
                                continue
                            queue.append((child, f"{where}/{entry.name}" if where else entry.name, depth + 1))
                    yield where, entries
                finally:
                    os.close(fd)
        finally:
            for fd, _, _ in queue:
                os.close(fd)

    # ------------------------------------------------------------------ writes

    def write(self, rel, data: bytes, *, mode: int | None = None) -> None:
        """Give rel (links followed inside the root: the file a link points to gets the bytes) new bytes, atomically:
        a temp file in the same held folder, fsync, rename onto the name. A new inode, never the old one written in
        place (uv hardlinks site-packages files into its cache). The mode (setuid/setgid included), the owner when
        running as root, and the extended attributes (POSIX ACLs among them) are taken from the file replaced, or
        `mode` when given. Missing folders on the way are created."""
        fd, name, where = self.walk_to(rel, create_folders=True)
        try:
            old = self.open_existing(fd, name, where)
            tmp = temp_name(name)
            tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(tmp_fd, view):]
                    os.fsync(tmp_fd)
                    copy_metadata(old, tmp_fd, mode)
                finally:
                    os.close(tmp_fd)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except FileNotFoundError:
                    pass
                raise
            finally:
                if old is not None:
                    os.close(old)
            fsync_fd(fd)
        finally:
            os.close(fd)

    def open_existing(self, fd: int, name: str, where) -> int | None:
        """An fd of the regular file being replaced (for its metadata), None when there is none; a special file
        there is a refusal (NotRegularFile), never opened."""
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):    # swapped in after the walk: the rename replaces the link itself
            return None
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"refusing to replace {self.display(where)}: it is {kind_of(st.st_mode)}",
                                 hint=SPECIAL_HINT)
        try:
            return os.open(name, os.O_RDONLY | os.O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None

    def create_exclusive(self, rel, data: bytes, *, mode: int = 0o644) -> bool:
        """Create rel with data unless something is there already (False then); no temp file, no link followed."""
        fd, name, _ = self.walk_to(rel, follow_last=False, create_folders=True)
        try:
            try:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode, dir_fd=fd)
            except FileExistsError:
                return False
            try:
                os.write(out, data)
            finally:
                os.close(out)
            return True
        finally:
            os.close(fd)

    def replace(self, rel: str, data: bytes | None) -> None:
        """Give the file rel its new bytes (None: remove it), as a run's write does. A symlink stays a symlink: the
        file it points to inside the root gets the bytes; one leading outside is refused (LeadsOutside). The
        bytecode of the file, under both names, goes with the old bytes (remove_stale_bytecode)."""
        try:
            resolved = "/".join(self.resolved(rel))
        except (FileNotFoundError, NotADirectoryError):     # a new file in folders the write creates
            resolved = rel
        if data is None:
            self.remove(rel)
        else:
            self.write(rel, data)
        for name in dict.fromkeys((rel, resolved)):
            self.remove_stale_bytecode(name)

    def remove_if_empty(self, rel: str) -> None:
        """Remove the folder rel that a run emptied: its __pycache__ first when nothing is left there (replace removed
        the bytecode of every file it removed), then the folder itself when nothing is left. A folder holding
        anything (a user's file, a user's bytecode) stays; nothing is followed through a link."""
        for name in (f"{rel}/__pycache__", rel):
            try:
                self.rmdir(name)
            except (OSError, IOFailure):    # a link leading out on the way: nothing there is this run's
                return

    def remove_stale_bytecode(self, rel: str) -> list[str]:
        """Delete __pycache__/<stem>.*.pyc of a rewritten .py file rel: a timestamp pyc written in the same second as
        a same-size edit, or a hash-based pyc that is never revalidated, would keep the old code running. Only a real
        __pycache__ folder is looked in (one that is a link may lead anywhere); returns what was removed."""
        parts = parts_of(rel)
        if not parts or not parts[-1].endswith(".py"):
            return []
        stem = parts[-1][:-3]
        cache = "/".join((*parts[:-1], "__pycache__"))
        st = self.lstat(cache)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return []
        removed = []
        for name in self.listdir(cache):
            if name.startswith(stem + ".") and name.endswith(".pyc") and name.count(".") == stem.count(".") + 2:
                try:
                    if self.remove(f"{cache}/{name}", follow_last=False):
                        removed.append(f"{cache}/{name}")
                except OSError:
                    continue
        return removed

    def remove(self, rel, *, follow_last: bool = True) -> bool:
        """Remove the file rel leads to (with follow_last, a link's target inside the root; else the link itself).
        False when there was nothing; a folder is left alone (IsADirectoryError)."""
        try:
            fd, name, where = self.walk_to(rel, follow_last=follow_last)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "a folder", str(self.display(where)))
            os.unlink(name, dir_fd=fd)
            fsync_fd(fd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def make_folders(self, rel, *, mode: int = 0o777) -> None:
        """Create the folder rel and every missing one above it, each step on the held handle."""
        if not parts_of(rel):
            return
        fd, name, _ = self.walk_to(rel, create_folders=True)
        try:
            os.mkdir(name, mode, dir_fd=fd)
        except FileExistsError:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(self.display(rel))) from None
        finally:
            os.close(fd)

    def make_folder_exclusive(self, rel, *, mode: int = 0o700) -> None:
        """Create the folder rel, FileExistsError when anything is there already (folders above it are made)."""
        fd, name, _ = self.walk_to(rel, follow_last=False, create_folders=True)
        try:
            os.mkdir(name, mode, dir_fd=fd)
        finally:
            os.close(fd)

    def rmdir(self, rel) -> bool:
        """Remove the folder rel when it is empty (the entry itself, never a link's target); False when it is not
        there, not empty, or not a folder."""
        try:
            fd, name, _ = self.walk_to(rel, follow_last=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            os.rmdir(name, dir_fd=fd)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def subroot(self, rel, *, links: bool = True, create: bool = False, mode: int = 0o700) -> "HeldRoot":
        """The folder rel as a handle of its own, reached without following a link at its last step (a link there:
        NotADirectoryError); created with mode when absent and create is set."""
        if create:
            self.make_folders(rel, mode=mode)
        fd = self.open_folder(rel, follow_last=False)
        return HeldRoot.from_fd(fd, self.display(rel), links=links)

    def tighten(self, mode: int) -> None:
        """The root folder's mode is at most mode: bits beyond it are taken away (a looser folder is made private)."""
        current = stat.S_IMODE(os.fstat(self.fd).st_mode)
        if current & ~mode:
            os.fchmod(self.fd, current & mode)

    def open_flags(self, rel, flags: int, mode: int = 0o600) -> int:
        """os.open of rel's last component on its held folder, with O_NOFOLLOW added (the caller's fd)."""
        fd, name, _ = self.walk_to(rel, follow_last=False)
        try:
            return os.open(name, flags | O_NOFOLLOW | O_CLOEXEC, mode, dir_fd=fd)
        finally:
            os.close(fd)

    def rename(self, src, dst) -> None:
        """Move src (the entry itself, never a link's target) to dst, both below the root; dst's folders are made."""
        sfd, sname, _ = self.walk_to(src, follow_last=False)
        try:
            dfd, dname, _ = self.walk_to(dst, follow_last=False, create_folders=True)
            try:
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                fsync_fd(dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    def remove_tree(self, rel) -> None:
        """Remove rel and everything below it, iteratively (no depth limit, no recursion), never through a link:
        a link is removed as a link. Nothing there is nothing to do."""
        try:
            fd, name, _ = self.walk_to(rel, follow_last=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            remove_tree_at(fd, name)
        finally:
            os.close(fd)

    def prune_empty(self, rel) -> None:
        """Remove every empty folder at or below rel, deepest first (a __pycache__ holding only bytecode counts as
        empty); never a folder above rel, never through a link."""
        try:
            top = self.open_folder(rel)
        except (FileNotFoundError, NotADirectoryError, NotRegularFile):
            return
        try:
            prune_at(top)
        finally:
            os.close(top)
        parent_fd, name, _ = self.walk_to(rel, follow_last=False)
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except OSError:
            pass
        finally:
            os.close(parent_fd)


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


class PathRoot(HeldRoot):
    """The same operations where the platform has no dir_fd (Windows): by path, each path checked right before it
    is used (its real path inside the root; no link at all where links are refused). Weaker than HeldRoot: a link
    swapped in between that check and the operation is followed (the README's safety section says so)."""

    def __init__(self, path: Path, *, links: bool = True):
        self.path, self.links, self.fd = Path(path), links, -1
        st = os.stat(self.path)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(self.path))
        self.identity = (st.st_dev, st.st_ino)
        self.real = Path(os.path.realpath(self.path))

    def close(self) -> None:
        pass

    def checked(self, rel, *, follow_last: bool = True) -> Path:
        parts = parts_of(rel)
        path = self.path.joinpath(*parts)
        if not self.links:
            step = self.path
            for part in parts:
                step = step / part
                if os.path.islink(step):
                    raise NotRegularFile(f"{step} is a symbolic link: applier refuses to follow links inside "
                                         f"{self.path}", hint="nothing was changed; move it aside by hand")
        probe = path if follow_last else path.parent
        real = Path(os.path.realpath(probe))
        if real != self.real and self.real not in real.parents:
            raise self.outside(rel, f"it leads to {real}")
        return path

    def resolved(self, rel) -> tuple[str, ...]:
        real = Path(os.path.realpath(self.checked(rel)))
        return real.relative_to(self.real).parts

    def stat(self, rel, *, follow_last: bool = True):
        try:
            path = self.checked(rel, follow_last=follow_last)
            return os.stat(path) if follow_last else os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read(self, rel, *, limit: int) -> bytes:
        path = self.checked(rel)
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"refusing to read {path}: it is {kind_of(st.st_mode)}, not a regular file",
                                 hint=SPECIAL_HINT)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            return read_fd(fd, path, limit)
        finally:
            os.close(fd)

    def listdir(self, rel=()) -> list[str]:
        try:
            return os.listdir(self.checked(rel)) if parts_of(rel) else os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk(self, rel="", *, max_depth: int, max_entries: int):
        top = self.checked(rel) if parts_of(rel) else self.path
        queue, seen = [(top, "/".join(parts_of(rel)), 0)], 0
        while queue:
            folder, where, depth = queue.pop(0)
            entries = []
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                try:
                    st = os.lstat(folder / name)
                except OSError:
                    continue
                entries.append((name, st))
                seen += 1
                if seen > max_entries:
                    raise WalkLimit(f"{top} holds more than {max_entries} entries", hint=WALK_HINT)
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 > max_depth:
                        raise WalkLimit(f"{top} holds folders nested more than {max_depth} deep", hint=WALK_HINT)
                    queue.append((folder / name, f"{where}/{name}" if where else name, depth + 1))
            yield where, entries

    def write(self, rel, data: bytes, *, mode: int | None = None) -> None:
        path = self.checked(rel)
        if os.path.islink(path):        # the file a link inside the root points to gets the bytes
            path = Path(os.path.realpath(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path if path.exists() else None
        tmp = path.with_name(temp_name(path.name))
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.chmod(tmp, mode if mode is not None else
                     stat.S_IMODE(os.stat(old).st_mode) if old else 0o666 & ~current_umask())
            self.checked(rel)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def create_exclusive(self, rel, data: bytes, *, mode: int = 0o644) -> bool:
        path = self.checked(rel, follow_last=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "xb") as handle:
                handle.write(data)
        except FileExistsError:
            return False
        return True

    def remove(self, rel, *, follow_last: bool = True) -> bool:
        try:
            os.unlink(self.checked(rel, follow_last=follow_last))
            return True
        except FileNotFoundError:
            return False

    def make_folders(self, rel, *, mode: int = 0o777) -> None:
        if parts_of(rel):
            os.makedirs(self.checked(rel), mode=mode, exist_ok=True)

    def make_folder_exclusive(self, rel, *, mode: int = 0o700) -> None:
        path = self.checked(rel, follow_last=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, mode)

    def rmdir(self, rel) -> bool:
        try:
            os.rmdir(self.checked(rel, follow_last=False))
            return True
        except OSError:
            return False

    def subroot(self, rel, *, links: bool = True, create: bool = False, mode: int = 0o700) -> "HeldRoot":
        if create:
            self.make_folders(rel, mode=mode)
        path = self.checked(rel, follow_last=False)
        if os.path.islink(path) or not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a real folder", str(path))
        return PathRoot(path, links=links)

    def tighten(self, mode: int) -> None:
        current = stat.S_IMODE(os.stat(self.path).st_mode)
        if current & ~mode:
            os.chmod(self.path, current & mode)

    def rename(self, src, dst) -> None:
        target = self.checked(dst, follow_last=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.checked(src, follow_last=False), target)

    def remove_tree(self, rel) -> None:
        path = self.checked(rel, follow_last=False)
        if os.path.islink(path) or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)

    def prune_empty(self, rel) -> None:
        top = self.checked(rel, follow_last=False)
        for where, _ in reversed(list(self.walk(rel, max_depth=64, max_entries=200_000))):
            try:
                os.rmdir(self.path / where if where else top)
            except OSError:
                continue


def hold(path: Path, *, links: bool = True) -> HeldRoot:
    """A handle on the folder: HeldRoot where the platform has dir_fd, PathRoot (checked paths) where it has not."""
    return HeldRoot(path, links=links) if supported() else PathRoot(path, links=links)


# ---------------------------------------------------------------------- the state folder, opened for a command

@dataclass(frozen=True)
class StoreLayout:
    """The state folder as open_store reads it: its name in the install and its path for messages, the files it
    holds, the documents a command reads when it opens it, and the limits it is read within."""
    name: str
    shown: Path
    lock_name: str
    gitignore: bytes
    journal_name: str
    data_name: str
    state_name: str
    manifest_name: str
    documents: tuple            # names read when the folder is opened (the journal among them)
    document_limit: int
    max_depth: int
    max_entries: int


@dataclass
class Opened:
    """The state folder as a command opened it, read once under the lock: the install's held root and its roots'
    identities ({path: (device, inode)}: every later write checks them), the folder's held handle (None: absent, not
    created) and the documents (bytes; None where absent)."""
    install: HeldRoot
    roots: dict
    folder: HeldRoot | None
    documents: dict = field(default_factory=dict)


def open_store(layout: StoreLayout, *, install: HeldRoot | None, install_root: Path, roots: dict | None,
               root_paths: list, create: bool = True, take_lock=None, read: bool = True) -> Opened:
    """Open the state folder for a command that may write: the install's root held (install: held already) and its
    roots' identities taken (roots: taken already; else those of root_paths), then checked (exit 9), the folder
    checked (check_store) and created 0700 inside the install (never above it: a deleted install is not recreated)
    with its .gitignore, the lock taken (take_lock(open_lock_file): the caller's context, entered on its own stack;
    None: the caller holds it already), then, with read, the documents read; a journal-data/ without its journal (a
    run killed before its commit point, no target file touched) is removed.
    folder None when it does not exist and create is False."""
    install = install if install is not None else hold_install(install_root)
    roots = roots if roots is not None else {path: identity(path) for path in root_paths}
    check_roots(roots)
    folder = check_store(install, layout, create=create)
    if folder is None:
        return Opened(install, roots, None)
    try:
        folder.tighten(0o700)
        folder.create_exclusive(".gitignore", layout.gitignore, mode=0o644)
    except OSError as exc:
        raise io_failure(exc, layout.shown, "create the state folder") from exc
    if take_lock is not None:
        take_lock(lambda: open_lock_file(folder, layout))
    if not read:
        return Opened(install, roots, folder)
    documents = {name: read_document(lambda name=name: folder.read(name, limit=layout.document_limit),
                                     layout.shown / name) for name in layout.documents}
    if documents.get(layout.journal_name) is None:
        with state_folder_refusals():
            if folder.lstat(layout.data_name) is not None:
                folder.remove_tree(layout.data_name)
    return Opened(install, roots, folder, documents)


def hold_install(path: Path) -> HeldRoot:
    """The install's root folder, held (IOFailure, exit 8, when it cannot be opened)."""
    try:
        return hold(path)
    except OSError as exc:
        raise io_failure(exc, path, "open") from exc


def check_store(install: HeldRoot, layout: StoreLayout, *, create: bool = False) -> HeldRoot | None:
    """The state folder's handle, held with links refused, once it is a real folder holding no link or special file
    anywhere (else StateCorruptError, exit 7, nothing written); created 0700 when absent and create is set, else
    None then."""
    shown = layout.shown
    st = install.lstat(layout.name)
    if st is None and not create:
        return None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise StateCorruptError(f"{shown} is a symbolic link: applier's state, lock and backups would land where it "
                                f"points ({os.readlink(shown)})",
                                hint="nothing was changed; replace the link by a real folder (move the folder it "
                                     "points to in its place if it holds this install's state)")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise StateCorruptError(f"{shown} is not a folder", hint="applier keeps its state in that folder: move the "
                                                                 "file aside")
    try:
        folder = install.subroot(layout.name, links=False, create=create)
    except (NotADirectoryError, NotRegularFile) as exc:
        raise StateCorruptError(f"{shown} is not a real folder (a link or a file stands there)",
                                hint="nothing was changed; move it aside by hand") from exc
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise io_failure(exc, shown, "create the state folder") from exc
    try:
        refuse_specials(folder, layout)
    except BaseException:
        folder.close()
        raise
    return folder


def refuse_specials(folder: HeldRoot, layout: StoreLayout) -> None:
    """StateCorruptError (exit 7) for a link, FIFO, device or socket anywhere inside the state folder."""
    try:
        for where, entries in folder.walk("", max_depth=layout.max_depth, max_entries=layout.max_entries):
            for name, entry in entries:
                if not (stat.S_ISDIR(entry.st_mode) or stat.S_ISREG(entry.st_mode)):
                    raise StateCorruptError(
                        f"{layout.shown / where / name} is {kind_of(entry.st_mode)}: applier refuses to follow links "
                        f"or use special files inside {layout.shown}",
                        hint="nothing was changed; move it aside by hand (a link there could lead a write outside the "
                             "install)")
    except NotRegularFile as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc


def open_lock_file(folder: HeldRoot, layout: StoreLayout) -> int:
    """The lock file's descriptor, opened (created 0600 when absent) without following a link."""
    try:
        return folder.open_flags(layout.lock_name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600)
    except NotRegularFile as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateCorruptError(f"{layout.shown / layout.lock_name} is a symbolic link",
                                    hint="nothing was changed; move it aside by hand") from exc
        raise io_failure(exc, layout.shown, "take the lock in") from exc


def read_document(read, shown: Path) -> bytes | None:
    """read() (a read of a state-folder document through a held handle): None when the document is absent;
    StateCorruptError when it is not a regular file (a link, a FIFO, a device), too large or unreadable."""
    try:
        return read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IOFailure as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc
    except PermissionError as exc:      # a right, not the document's damage: exit 8, with whose it is
        raise denied(exc, shown, "read") from exc
    except OSError as exc:
        raise StateCorruptError(f"cannot read {shown}: {exc.strerror}") from exc


def denied(exc: OSError, shown: Path, action: str) -> IOFailure:
    """Permission denied on a file of the state folder (exit 8): whose it is, and the two ways out."""
    try:
        uid = os.lstat(shown).st_uid
    except OSError:
        uid = None
    owner = "another user"
    if uid is not None:
        try:
            import pwd
            owner = f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
        except (ImportError, KeyError):
            owner = f"uid {uid}"
    return io_failure(exc, shown, action, hint=f"it belongs to {owner}; nothing was changed. Run applier as the user "
                                               "who owns the install, or give this user the state folder "
                                               "(chown -R USER .applier)")


# ---------------------------------------------------------------------- a run, written through held handles
# In this order: the originals it replaces (`backups/`) and the bytes every file will have and had (`journal-data/`),
# then `journal.json` (the commit point), then each target file (temp file + fsync + os.replace), then the folders
# the run emptied, then the overlay manifest and `state.json`, then the journal is removed. An error (disk full,
# permission, a link swapped in) before the commit point removes what the run wrote; one while files are replaced
# gives the written ones their old bytes back. A run committed already (an interrupted one that recovery finishes)
# has nothing to roll back: an error leaves its journal for the next command. Every write into the state folder goes
# through its handle, which refuses links anywhere inside it (exit 7); before every write the install's roots are
# checked to be the folders the command opened (exit 9).

NOTHING_CHANGED = "nothing was changed; fix the cause (permissions, free space) and run the command again"
NOT_RECORDED = ("the run's files are in place, but not yet recorded: its journal in .applier/ is kept, and the next "
                "applier command on this install records them (fix the cause first: free space, permissions); nothing "
                "needs undoing by hand")


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


KEEP = object()              # a run's manifest: leave the overlay manifest as it is


@dataclass(frozen=True)
class RunEnds:
    """What a run needs of the state folder (StateStore.run_ends): its held handle (created, 0700, with its
    .gitignore), its layout (the names of the run's files in it, its path for messages), the install's roots as the
    command opened them ({path: (device, inode)}), and the documents recorded at the end: the state, and the overlay
    manifest (KEEP: left as it is; None: removed)."""
    folder: HeldRoot
    layout: StoreLayout
    roots: dict
    state_after: dict
    manifest_after: object


@dataclass
class Write:
    """One target file of a run: its place (a confine.Place) and the bytes it has (None: absent) and will have
    (None: removed). For a run committed already (recovery): expect, the (old, new) sha256 the journal recorded (the
    file is written only while it still holds its old bytes), and blob, the name in journal-data/ of its new bytes
    (read only then)."""
    place: object               # confine.Place
    old: bytes | None
    new: bytes | None
    expect: tuple | None = None
    blob: str | None = None


@dataclass
class Sweep:
    """Where a killed write can have left a temp file: folders listed (their own entries) and trees walked, each a
    (handle, relative path) pair, within the walk's limits."""
    listed: list
    walked: list
    max_depth: int
    max_entries: int


@dataclass(frozen=True)
class Carried:
    """What carry_out did: the target files it wrote and the temp files it swept."""
    written: int
    swept: int


@dataclass
class Run:
    """A whole run as data: what carry_out writes, in order. journal None: committed already (recovery)."""
    ends: RunEnds
    files: list[Write]
    journal: bytes | None = None
    backups: list[tuple[str, bytes, int]] = field(default_factory=list)   # (name in the state folder, bytes, mode)
    blobs: list[tuple[str, bytes]] = field(default_factory=list)          # (name in journal-data/, bytes)
    fresh: list = field(default_factory=list)     # folders the run creates: removed again on a rollback
    prune: list = field(default_factory=list)     # folders to remove where the run left them empty
    sweep: Sweep | None = None                    # temp files to remove at the end (recovery)
    made: list = field(default_factory=list)      # backups the run created (none was there): gone on a rollback


def carry_out(run: Run) -> Carried:
    """Write the run, or change nothing (before the commit point, and on a failure while files are replaced); a
    committed run's failure leaves its journal, which the next command finishes. A run committed already (ends set,
    no journal: recovery) writes only the files still at their old bytes, every file checked first; a run with no
    ends writes nothing. Then the temp files of run.sweep are removed. Caller holds the target lock."""
    fresh_run = run.journal is not None
    files = run.files if fresh_run else still_to_write(run)
    if fresh_run:
        commit(run)
        failpoint("after-journal")
    done: list[Write] = []
    for write in files:
        try:
            check_roots(run.ends.roots)   # a moved or deleted install: stop; its journal goes with it, finishes there
            call_hook("before-write", write.place)
            write.place.held.replace(write.place.relpath, write.new)
        except (OSError, IOFailure) as exc:
            if not fresh_run:
                if isinstance(exc, IOFailure):
                    raise
                raise io_failure(exc, write.place.path, "finish the interrupted run on") from exc
            roll_back(run, done, exc, write.place)
        done.append(write)
        if fresh_run and len(done) == 1:
            failpoint("after-first-file")
    if fresh_run:
        failpoint("after-files")
    if run.ends is not None:
        finish(run)
    return Carried(len(done), sweep_temp_files(run.sweep))


def still_to_write(run: Run) -> list[Write]:
    """The files of a committed run that still hold their old bytes, each file checked (and its new bytes against
    the journal's sha256) before the first is written: StateCorruptError, nothing written, for one that holds
    neither its old nor its new bytes, or whose new bytes are missing or damaged."""
    if run.ends is None:
        return []
    data = run.ends.layout.shown / run.ends.layout.data_name
    files = []
    for write in run.files:
        old_sha, new_sha = write.expect
        current = write.place.sha256()
        if current == new_sha:
            continue
        if current != old_sha:
            raise StateCorruptError(
                f"interrupted run: {write.place} holds neither its old nor its new bytes (sha256 {current})",
                hint=f"someone changed it meanwhile; compare with {data} and fix by hand, "
                     f"then remove {run.ends.layout.shown / run.ends.layout.journal_name}")
        new = write.new if write.blob is None else read_blob(run.ends, write.blob)
        if (None if new is None else hashlib.sha256(new).hexdigest()) != new_sha:
            raise StateCorruptError(f"journal data for {write.place} is missing or damaged",
                                    hint=f"see {run.ends.layout.shown / run.ends.layout.journal_name}")
        files.append(replace(write, new=new))
    return files


def read_blob(ends: RunEnds, name: str) -> bytes | None:
    """A blob of journal-data/, read only when it is a regular file reached without a link (None otherwise)."""
    try:
        return ends.folder.read(f"{ends.layout.data_name}/{name}", limit=MAX_READ_BYTES)
    except (OSError, IOFailure, ValueError):   # gone, special, far too large, a name no file can have: damaged
        return None


def temp_files(sweep: Sweep | None) -> list[tuple[HeldRoot, str]]:
    """Every temp file a killed write can have left where sweep says: names of applier's own shape (is_temp_name: a
    user's file never matches by chance), regular files; each folder walked through its root's handle (a link out
    of the root is not walked)."""
    if sweep is None:
        return []
    listings = []
    for held, rel in sweep.listed:
        try:
            names = held.listdir(rel)
        except (OSError, IOFailure):
            continue
        listings.append((held, rel, [(n, held.lstat(f"{rel}/{n}" if rel else n)) for n in names if is_temp_name(n)]))
    for held, top in sweep.walked:
        try:
            for where, entries in held.walk(top, max_depth=sweep.max_depth, max_entries=sweep.max_entries):
                listings.append((held, where, [(n, st) for n, st in entries if is_temp_name(n)]))
        except (OSError, IOFailure):
            continue
    return [(held, f"{where}/{name}" if where else name) for held, where, entries in listings
            for name, st in entries if st is not None and stat.S_ISREG(st.st_mode)]


def sweep_temp_files(sweep: Sweep | None) -> int:
    """Remove the temp files killed writes left (temp_files); the caller holds the target lock (a live run's temp
    file is never touched). Returns how many were removed."""
    removed = 0
    for held, rel in temp_files(sweep):
        try:
            if held.remove(rel, follow_last=False):
                removed += 1
        except (OSError, IOFailure):
            continue
    return removed


def commit(run: Run) -> None:
    """The backups, journal-data/ and then journal.json, the run's commit point; or, on a failure (disk full),
    remove what was written and raise IOFailure."""
    ends, folder = run.ends, run.ends.folder
    check_roots(ends.roots)
    written = []
    try:
        with state_folder_refusals():
            for name, data, mode in run.backups:
                if folder.lstat(name) is None:
                    run.made.append(name)
                folder.write(name, data, mode=mode)
                written.append(name)
    except OSError as exc:
        remove_all(ends, written)
        raise io_failure(exc, ends.layout.shown / "backups", "write backups into") from exc
    try:
        with state_folder_refusals():
            folder.remove_tree(ends.layout.data_name)
            folder.make_folders(ends.layout.data_name, mode=0o700)
            for name, data in run.blobs:
                folder.write(f"{ends.layout.data_name}/{name}", data, mode=0o600)
            failpoint("after-backups")
            check_roots(ends.roots)
            folder.write(ends.layout.journal_name, run.journal, mode=0o600)
    except OSError as exc:
        with state_folder_refusals():
            folder.remove_tree(ends.layout.data_name)
        remove_all(ends, written)
        raise io_failure(exc, ends.layout.shown, "write the journal in") from exc


def roll_back(run: Run, done: list[Write], exc: BaseException, place) -> None:
    """A write failed (disk full, permission, a link leading out swapped in): give the files already written their
    old bytes back, remove the folders the run created, drop the journal, then raise what failed. Should the
    rollback itself fail, the journal stays: the next command finishes the run."""
    try:
        for written in reversed(done):
            written.place.held.replace(written.place.relpath, written.old)
        for folder in run.fresh:
            folder.held.remove_if_empty(folder.relpath)
    except (OSError, IOFailure) as second:
        raise IOFailure(f"cannot replace {place}: {exc}; rolling back failed too ({second})",
                        hint="the journal in .applier/ is kept: fix the cause and run any applier command on the "
                             "install, which finishes the run") from exc
    drop(run.ends)
    remove_all(run.ends, run.made)      # the originals it backed up: no record names them now
    with state_folder_refusals():
        for name in run.made:
            parts = parts_of(name)
            for n in range(len(parts) - 1, 0, -1):      # their folders, where that left them empty
                run.ends.folder.rmdir("/".join(parts[:n]))
    if isinstance(exc, NotRegularFile):
        raise IOFailure(exc.message.replace("nothing more was changed", "").rstrip(),
                        hint="the files this run had replaced got their old bytes back; nothing outside the install "
                             "was touched. " + (exc.hint or "")) from exc
    if isinstance(exc, IOFailure):
        raise exc
    raise io_failure(exc, place.path, "replace") from exc


def finish(run: Run) -> None:
    """Remove the folders the run emptied, then record what it leaves (manifest, state) and remove the journal."""
    ends, folder = run.ends, run.ends.folder
    for place in sorted(run.prune, key=lambda p: p.relpath.count("/"), reverse=True):
        place.held.remove_if_empty(place.relpath)
    call_hook("before-state", ends)
    try:
        with state_folder_refusals():
            if ends.manifest_after is None:
                folder.remove(ends.layout.manifest_name, follow_last=False)
            elif ends.manifest_after is not KEEP:
                folder.write(ends.layout.manifest_name, dump_json(ends.manifest_after), mode=0o600)
            folder.write(ends.layout.state_name, dump_json(ends.state_after), mode=0o600)
    except OSError as exc:
        raise io_failure(exc, ends.layout.shown, "record the state in", hint=NOT_RECORDED) from exc
    failpoint("after-state")
    try:
        drop(ends)
    except OSError as exc:
        raise io_failure(exc, ends.layout.shown / ends.layout.journal_name, "remove the finished run's journal",
                         hint="the run is done and recorded; the next applier command on this install removes its "
                              "journal (fix the permissions first)") from exc


def drop(ends: RunEnds) -> None:
    """Remove the journal and its blobs (a finished run, or one rolled back)."""
    with state_folder_refusals():
        ends.folder.remove(ends.layout.journal_name, follow_last=False)
        ends.folder.remove_tree(ends.layout.data_name)


def remove_all(ends: RunEnds, names: list[str]) -> None:
    with state_folder_refusals():
        for name in names:
            ends.folder.remove(name, follow_last=False)


@contextmanager
def state_folder_refusals():
    """A link or a special file met inside the state folder is a refusal (exit 7), never followed."""
    try:
        yield
    except NotRegularFile as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc


def call_hook(name: str, arg) -> None:
    """The race tests' hook at this point of the run (failpoints.HOOKS; none outside tests)."""
    assert name in HOOK_NAMES, name
    function = HOOKS.get(name)
    if function is not None:
        function(arg)


def identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_roots(roots: dict) -> None:
    """BadTargetError (exit 9) when the install root or a component root is no longer the folder this run started
    on (renamed, deleted or replaced meanwhile): a run never writes into, or recreates, another tree."""
    for path, held in roots.items():
        if held is not None and identity(path) != held:
            raise BadTargetError(f"{path} was moved, deleted or replaced while this command ran",
                                 hint="nothing more is written; if files were already replaced, the next applier "
                                      "command on the install (wherever it now is) finishes the run from its "
                                      "journal")
