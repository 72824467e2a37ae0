"""Where the platform has no dir_fd (Windows): PathRoot, the held root's fallback, checks each path right before it
uses it (a link swapped in between can still lead outside: the README's safety section says so); `hold` gives the
held root where the platform allows it, this one elsewhere."""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from applier.store.fileops import (SPECIAL_HINT, WALK_HINT, NotRegularFile, WalkLimit, current_umask, kind_of,
                                   parts_of, read_fd, supported, temp_name)
from applier.store.heldroot import HeldRoot


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
