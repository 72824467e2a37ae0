"""A folder written whole or not at all (`applier overlay export`): every file is first written into a sibling staging
folder (`.<name>.applier-export`, beside the destination, so on its file system), then moved into place by renames,
which need no free space.

    a new or empty destination    the staging folder is renamed onto it: one step, the folder appears whole
    an earlier export             each file is renamed over its old copy, the old one kept (a hard link) in the
                                  staging folder until all are in; a failure puts every old copy back

A failure while staging (a full disk, a denied permission) removes the staging folder and leaves the destination as
it was; a process killed meanwhile leaves only the staging folder, which the next export removes before it starts
(its marker file says it is applier's, and its lock that no export is still writing it). A run killed while files
are renamed into an earlier export leaves each file whole (old or new bytes): the next export writes them all again.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from applier.errors import IOFailure, LockedError, RefusedError
from applier.store.failpoints import failpoint
from applier.store.fileops import io_failure
from applier.store.heldroot import HeldRoot, hold, parts_of

try:
    import fcntl
except ImportError:         # Windows: no lock on the marker (a second export at once is the user's own race there)
    fcntl = None

STAGING_SUFFIX = ".applier-export"
MARKER = "applier-export.marker"
NEW, OLD = "new", "old"


def staging_name(name: str) -> str:
    return f".{name}{STAGING_SUFFIX}"


@dataclass
class Written:
    """What write_folder did: whether it removed an interrupted export's staging folder first."""
    staging: Path
    recovered: bool = False
    moved: list = field(default_factory=list)


def write_folder(dest: Path, files: dict[str, bytes], *, remove: tuple = (), mode: int = 0o644) -> Written:
    """Write files ({path inside dest: bytes}) into dest and remove the files of `remove`, all or nothing. dest is a
    new or empty folder, or one holding an earlier copy (its other files stay). IOFailure (exit 8) when the disk is
    full or a write is denied, dest then as it was; LockedError (exit 4) while another export writes the same
    folder."""
    dest = Path(os.path.abspath(dest))
    if not dest.name:
        raise RefusedError(f"{dest} is not a folder applier can write into", hint="name a new folder")
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        top = hold(parent)
    except OSError as exc:
        raise io_failure(exc, parent, "create the folder") from exc
    staging = staging_name(dest.name)
    done = Written(parent / staging)
    try:
        done.recovered = clear_leftover(top, staging, parent)
        marker = claim(top, staging, parent)
        try:
            stage(top, staging, files, mode, dest)
            failpoint("export-staged")
            st = top.lstat(dest.name)
            if st is None or (stat.S_ISDIR(st.st_mode) and not top.listdir(dest.name)):
                move_whole(top, staging, dest, st)
            else:
                done.moved = swap_files(top, staging, dest, sorted(files), list(remove))
        finally:
            os.close(marker)
            top.remove_tree(staging)
    finally:
        top.close()
    return done


def clear_leftover(top: HeldRoot, staging: str, parent: Path) -> bool:
    """Remove the staging folder an interrupted export left (True then). One without applier's marker is not
    touched (RefusedError); one whose marker is locked belongs to an export still running (LockedError)."""
    st = top.lstat(staging)
    if st is None:
        return False
    shown = parent / staging
    if not stat.S_ISDIR(st.st_mode) or top.lstat(f"{staging}/{MARKER}") is None:
        raise RefusedError(f"{shown} is in the way: applier stages an export there, and this is not one of its own",
                           hint="nothing was changed; move it aside by hand")
    fd = top.open_flags(f"{staging}/{MARKER}", os.O_RDWR)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                raise LockedError(f"another applier export is writing {shown.parent / staging[1:-len(STAGING_SUFFIX)]}",
                                  hint="wait for it to finish, then run the command again") from exc
        top.remove_tree(staging)
    except OSError as exc:
        raise io_failure(exc, shown, "remove the interrupted export's folder") from exc
    finally:
        os.close(fd)
    return True


def claim(top: HeldRoot, staging: str, parent: Path) -> int:
    """Create the staging folder with its marker, locked for this run (the marker's descriptor, the caller's)."""
    try:
        top.make_folder_exclusive(staging, mode=0o777)
    except FileExistsError as exc:
        raise LockedError(f"another applier export started in {parent} meanwhile",
                          hint="wait for it to finish, then run the command again") from exc
    except OSError as exc:
        raise io_failure(exc, parent / staging, "create the export's staging folder") from exc
    try:
        fd = top.open_flags(f"{staging}/{MARKER}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError as exc:
        top.remove_tree(staging)
        raise io_failure(exc, parent / staging, "create the export's staging folder") from exc


def stage(top: HeldRoot, staging: str, files: dict[str, bytes], mode: int, dest: Path) -> None:
    """Every file into the staging folder's new/; on a failure the caller removes the staging folder and dest is
    untouched: said so in the error."""
    try:
        for rel, data in files.items():
            top.write(f"{staging}/{NEW}/{rel}", data, mode=mode)
    except (OSError, IOFailure) as exc:
        failure = exc if isinstance(exc, IOFailure) else io_failure(exc, dest, "write the export into")
        raise IOFailure(failure.message, hint=f"nothing was changed: {dest} is as it was, and the partial copy "
                                              f"beside it is removed; fix the cause (free space, permissions) and "
                                              f"run the command again") from exc


def move_whole(top: HeldRoot, staging: str, dest: Path, st) -> None:
    """A new destination, or an empty folder (its mode kept): the staged folder renamed onto it in one step."""
    new = f"{staging}/{NEW}"
    try:
        if st is not None:
            os.chmod(top.display(new), stat.S_IMODE(st.st_mode))
        try:
            top.rename(new, dest.name)
        except OSError as exc:          # a platform that does not rename onto an empty folder
            if st is None or exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EACCES, errno.EPERM):
                raise
            top.rmdir(dest.name)
            top.rename(new, dest.name)
    except OSError as exc:
        raise IOFailure(io_failure(exc, dest, "move the export into").message,
                        hint=f"nothing was changed: {dest} is as it was; fix the cause and run the command "
                             "again") from exc


def swap_files(top: HeldRoot, staging: str, dest: Path, rels: list[str], remove: list[str]) -> list[str]:
    """Rename each staged file over its place in dest (the old copy hard-linked aside first), then remove the files
    of `remove` (kept aside likewise); on any failure every step is undone and IOFailure says dest is as it was."""
    target = top.subroot(dest.name)
    undo: list = []
    try:
        for rel in rels:
            undo.extend(make_parents(target, rel))
            dfd, dname, _ = target.walk_to(rel, follow_last=False)
            try:
                kept = keep_aside(top, staging, rel, dfd, dname)
                sfd, sname, _ = top.walk_to(f"{staging}/{NEW}/{rel}", follow_last=False)
                try:
                    os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                finally:
                    os.close(sfd)
                undo.append(("put back", rel) if kept else ("remove", rel))
            finally:
                os.close(dfd)
            failpoint("export-file-moved")
        for rel in remove:
            dfd, dname, _ = target.walk_to(rel, follow_last=False)
            try:
                if keep_aside(top, staging, rel, dfd, dname):
                    os.unlink(dname, dir_fd=dfd)
                    undo.append(("put back", rel))
            finally:
                os.close(dfd)
    except BaseException as exc:
        try:
            undo_swap(top, staging, target, undo)
        except (OSError, IOFailure) as second:
            raise IOFailure(f"cannot finish the export into {dest}: {exc}; putting the old files back failed too "
                            f"({second})", hint=f"{dest} holds old and new files, each whole: run the same export "
                                               "again once the cause is fixed") from exc
        if isinstance(exc, OSError):
            raise IOFailure(io_failure(exc, dest, "move the export into").message,
                            hint=f"nothing was changed: every file of {dest} is as it was; fix the cause and run "
                                 "the command again") from exc
        raise
    finally:
        target.close()
    return [rel for what, rel in undo if what != "folder"]


def make_parents(target: HeldRoot, rel: str) -> list:
    """The folders on rel's way that do not exist yet, created; as undo steps (removed again on a failure)."""
    made = []
    parts = parts_of(rel)[:-1]
    for n in range(1, len(parts) + 1):
        where = "/".join(parts[:n])
        if target.lstat(where) is None:
            target.make_folders(where)
            made.append(("folder", where))
    return made


def keep_aside(top: HeldRoot, staging: str, rel: str, dfd: int, dname: str) -> bool:
    """Hard-link dest's current file (the entry itself) into the staging folder's old/; False when there is none.
    Where hard links are not to be had, the file is moved there instead."""
    try:
        os.stat(dname, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    ofd, oname, _ = top.walk_to(f"{staging}/{OLD}/{rel}", follow_last=False, create_folders=True)
    try:
        try:
            os.link(dname, oname, src_dir_fd=dfd, dst_dir_fd=ofd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise
            os.rename(dname, oname, src_dir_fd=dfd, dst_dir_fd=ofd)
    finally:
        os.close(ofd)
    return True


def undo_swap(top: HeldRoot, staging: str, target: HeldRoot, undo: list) -> None:
    for what, rel in reversed(undo):
        if what == "folder":
            target.rmdir(rel)
        elif what == "remove":
            target.remove(rel, follow_last=False)
        else:
            ofd, oname, _ = top.walk_to(f"{staging}/{OLD}/{rel}", follow_last=False)
            dfd, dname, _ = target.walk_to(rel, follow_last=False)
            try:
                os.replace(oname, dname, src_dir_fd=ofd, dst_dir_fd=dfd)
            finally:
                os.close(ofd)
                os.close(dfd)
