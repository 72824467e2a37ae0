"""The state folder (`.applier/`) opened for a command, in one pass, through the install's root its caller holds:
the roots' identities taken, the folder checked (a real folder, no link or special file anywhere in it) and created
0700 with its .gitignore, the lock taken, the documents read; a document the user may not read is exit 8, one that
is damaged exit 7. check_roots stops a run whose install was moved or replaced meanwhile (exit 9).

Then a run's own files in it, each step one operation through the folder's held handle (RunEnds: what a run needs of
the folder): the backups and journal-data/ (stage) and journal.json (the commit point) written, or nothing left on
a failure; a blob read back; the overlay manifest and state recorded, then the finished run's journal dropped; what
a rolled-back run wrote removed. A link or special file met there is a refusal (exit 7), never followed;
writer.carry_out decides when each runs, and fires the failpoints between them."""
from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from applier.errors import BadTargetError, IOFailure, StateCorruptError
from applier.store.fileops import MAX_READ_BYTES, NotRegularFile, dump_json, io_failure, kind_of
from applier.store.heldroot import HeldRoot, hold, parts_of


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


def open_store(layout: StoreLayout, *, install: HeldRoot, roots: dict | None, root_paths: list, create: bool = True,
               take_lock=None, read: bool = True) -> Opened:
    """Open the state folder for a command that may write, the install's root held by the caller: its roots'
    identities taken (roots: taken already; else those of root_paths), then checked (exit 9), the folder checked
    (check_store) and created 0700 inside the install (never above it: a deleted install is not recreated) with its
    .gitignore, the lock taken (take_lock(open_fd): the caller's context, entered on its own stack, lock.take words
    a failure to open the lock file; None: the caller holds it already), then, with read, the documents read; a
    journal-data/ without its journal (a run killed before its commit point, no target file touched) is removed.
    folder None when it does not exist and create is False."""
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
        take_lock(lambda: folder.open_flags(layout.lock_name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600))
    if not read:
        return Opened(install, roots, folder)
    documents = {}
    for name in layout.documents:
        try:
            documents[name] = folder.read(name, limit=layout.document_limit)
        except (FileNotFoundError, NotADirectoryError):
            documents[name] = None
        except (OSError, IOFailure) as exc:
            raise document_failure(exc, layout.shown / name) from exc
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
    try:        # a link, FIFO, device or socket anywhere inside: refused (exit 7)
        for where, entries in folder.walk("", max_depth=layout.max_depth, max_entries=layout.max_entries):
            for name, entry in entries:
                if not (stat.S_ISDIR(entry.st_mode) or stat.S_ISREG(entry.st_mode)):
                    raise StateCorruptError(
                        f"{shown / where / name} is {kind_of(entry.st_mode)}: applier refuses to follow links or "
                        f"use special files inside {shown}",
                        hint="nothing was changed; move it aside by hand (a link there could lead a write outside the "
                             "install)")
    except NotRegularFile as exc:
        folder.close()
        raise StateCorruptError(exc.message, hint=exc.hint) from exc
    except BaseException:
        folder.close()
        raise
    return folder


def read_document(read, shown: Path) -> bytes | None:
    """read() (a read of a state-folder document through a held handle): None when the document is absent;
    StateCorruptError when it is not a regular file (a link, a FIFO, a device), too large or unreadable."""
    try:
        return read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, IOFailure) as exc:
        raise document_failure(exc, shown) from exc


def document_failure(exc: OSError | IOFailure, shown: Path) -> StateCorruptError | IOFailure:
    """What a failed read of the state-folder document shown raises (exc: neither absent nor a missing folder): an
    IOFailure's refusal (a link, a special file, too large) or a damage is StateCorruptError (exit 7); a permission
    denied is exit 8 (denied)."""
    if isinstance(exc, IOFailure):
        return StateCorruptError(exc.message, hint=exc.hint)
    if isinstance(exc, PermissionError):      # a right, not the document's damage: exit 8, with whose it is
        return denied(exc, shown, "read")
    return StateCorruptError(f"cannot read {shown}: {exc.strerror}")


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


@contextmanager
def state_folder_refusals():
    """A link or a special file met inside the state folder is a refusal (exit 7), never followed."""
    try:
        yield
    except NotRegularFile as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc


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


# ------------------------------------------------------------------ a run's own files in it

NOT_RECORDED = ("the run's files are in place, but not yet recorded: its journal in .applier/ is kept, and the next "
                "applier command on this install records them (fix the cause first: free space, permissions); nothing "
                "needs undoing by hand")


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


def stage(ends: RunEnds, backups: list, blobs: list, made: list) -> list[str]:
    """The backups (each name that was not there yet added to made), then journal-data/ with the run's blobs; the
    backup names written are returned for write_journal. On a failure (disk full) what was written is removed and
    IOFailure raised."""
    folder, layout = ends.folder, ends.layout
    written = []
    try:
        with state_folder_refusals():
            for name, data, mode in backups:
                if folder.lstat(name) is None:
                    made.append(name)
                folder.write(name, data, mode=mode)
                written.append(name)
    except OSError as exc:
        remove_all(ends, written)
        raise io_failure(exc, layout.shown / "backups", "write backups into") from exc
    try:
        with state_folder_refusals():
            folder.remove_tree(layout.data_name)
            folder.make_folders(layout.data_name, mode=0o700)
            for name, data in blobs:
                folder.write(f"{layout.data_name}/{name}", data, mode=0o600)
    except OSError as exc:
        raise unstaged(ends, written, exc) from exc
    return written


def write_journal(ends: RunEnds, journal: bytes, written: list[str]) -> None:
    """journal.json, the run's commit point; on a failure what stage wrote is removed and IOFailure raised."""
    folder, layout = ends.folder, ends.layout
    try:
        with state_folder_refusals():
            folder.write(layout.journal_name, journal, mode=0o600)
    except OSError as exc:
        raise unstaged(ends, written, exc) from exc


def unstaged(ends: RunEnds, written: list[str], exc: OSError) -> IOFailure:
    """Remove what stage wrote (journal-data/, the backups written); the IOFailure to raise for exc."""
    folder, layout = ends.folder, ends.layout
    with state_folder_refusals():
        folder.remove_tree(layout.data_name)
    remove_all(ends, written)
    return io_failure(exc, layout.shown, "write the journal in")


def read_blob(ends: RunEnds, name: str) -> bytes | None:
    """A blob of journal-data/, read only when it is a regular file reached without a link (None otherwise)."""
    try:
        return ends.folder.read(f"{ends.layout.data_name}/{name}", limit=MAX_READ_BYTES)
    except (OSError, IOFailure, ValueError):   # gone, special, far too large, a name no file can have: damaged
        return None


def record(ends: RunEnds) -> None:
    """Record what the run leaves: the overlay manifest, then the state (the journal stays until drop_finished)."""
    folder, layout = ends.folder, ends.layout
    try:
        with state_folder_refusals():
            if ends.manifest_after is None:
                folder.remove(layout.manifest_name, follow_last=False)
            elif ends.manifest_after is not KEEP:
                folder.write(layout.manifest_name, dump_json(ends.manifest_after), mode=0o600)
            folder.write(layout.state_name, dump_json(ends.state_after), mode=0o600)
    except OSError as exc:
        raise io_failure(exc, layout.shown, "record the state in", hint=NOT_RECORDED) from exc


def drop_finished(ends: RunEnds) -> None:
    """Remove a finished, recorded run's journal (drop); a failure there is IOFailure saying the run is done."""
    try:
        drop(ends)
    except OSError as exc:
        raise io_failure(exc, ends.layout.shown / ends.layout.journal_name, "remove the finished run's journal",
                         hint="the run is done and recorded; the next applier command on this install removes its "
                              "journal (fix the permissions first)") from exc


def discard(ends: RunEnds, made: list) -> None:
    """A rolled-back run's files: the journal dropped, the backups it created removed (no record names them now),
    then their folders where that left them empty."""
    drop(ends)
    remove_all(ends, made)
    with state_folder_refusals():
        for name in made:
            parts = parts_of(name)
            for n in range(len(parts) - 1, 0, -1):
                ends.folder.rmdir("/".join(parts[:n]))


def drop(ends: RunEnds) -> None:
    """Remove the journal and its blobs (a finished run, or one rolled back)."""
    with state_folder_refusals():
        ends.folder.remove(ends.layout.journal_name, follow_last=False)
        ends.folder.remove_tree(ends.layout.data_name)


def remove_all(ends: RunEnds, names: list[str]) -> None:
    with state_folder_refusals():
        for name in names:
            ends.folder.remove(name, follow_last=False)
