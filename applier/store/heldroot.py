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

Where the platform lacks `dir_fd` (Windows), `supported()` is False and `hold` gives a PathRoot instead: the same
operations by path, each path checked right before it is used; a race there can still lead outside (the README's
safety section says so). Beside it: fileops.py (the flags, errors and the steps at a folder's descriptor),
statefolder.py (`.applier/` opened for a command) and writer.py (a run's one writer)."""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from applier.errors import IOFailure
from applier.store.fileops import (MAX_LINK_HOPS, O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW, OUTSIDE_HINT, SPECIAL_HINT,
                                   WALK_HINT, LeadsOutside, NotRegularFile, WalkLimit, copy_metadata, create_at,
                                   current_umask, fsync_fd, kind_of, make_folder_at, open_regular_at, prune_at,
                                   remove_tree_at, supported, temp_name, too_large, walk_at)


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


def replace_at(fd: int, name: str, data: bytes, mode: int | None, shown) -> None:
    """HeldRoot.write's atomic replace of fd/name: a temp file beside it (O_EXCL, never a link), fsynced, given the
    replaced file's metadata (copy_metadata), renamed onto the name; a special file there is refused (open_existing)."""
    old = open_existing(fd, name, shown)
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


def open_existing(fd: int, name: str, shown) -> int | None:
    """An fd of the regular file fd/name being replaced (for its metadata), None when there is none; a special file
    there is a refusal (NotRegularFile), never opened."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):    # swapped in after the walk: the rename replaces the link itself
        return None
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"refusing to replace {shown}: it is {kind_of(st.st_mode)}", hint=SPECIAL_HINT)
    try:
        return os.open(name, os.O_RDONLY | os.O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None



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
        """A read-only fd of the regular file rel leads to (links followed inside the root): a special file is refused
        unopened, a link swapped in meanwhile is walked again (open_regular_at)."""
        for _ in range(MAX_LINK_HOPS):
            fd, name, where = self.walk_to(rel)
            try:
                file_fd = open_regular_at(fd, name, self.display(where))
            finally:
                os.close(fd)
            if file_fd is not None:
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
        yield from walk_at(top, "/".join(parts_of(rel)), self.display(rel), max_depth, max_entries)

    # ------------------------------------------------------------------ writes

    def write(self, rel, data: bytes, *, mode: int | None = None) -> None:
        """Give rel (links followed inside the root: the file a link points to gets the bytes) new bytes, atomically:
        a temp file in the same held folder, fsync, rename onto the name. A new inode, never the old one written in
        place (uv hardlinks site-packages files into its cache). The mode (setuid/setgid included), the owner when
        running as root, and the extended attributes (POSIX ACLs among them) are taken from the file replaced, or
        `mode` when given. Missing folders on the way are created."""
        fd, name, where = self.walk_to(rel, create_folders=True)
        try:
            replace_at(fd, name, data, mode, self.display(where))
        finally:
            os.close(fd)

    def create_exclusive(self, rel, data: bytes, *, mode: int = 0o644) -> bool:
        """Create rel with data unless something is there already (False then); no temp file, no link followed."""
        fd, name, _ = self.walk_to(rel, follow_last=False, create_folders=True)
        try:
            return create_at(fd, name, data, mode)
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
            make_folder_at(fd, name, mode, self.display(rel))
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
