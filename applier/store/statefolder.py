"""The state folder (`.applier/`) opened for a command, in one pass: the install's root held and its roots'
identities taken, the folder checked (a real folder, no link or special file anywhere in it) and created 0700 with
its .gitignore, the lock taken, the documents read; a document the user may not read is exit 8, one that is damaged
exit 7. check_roots stops a run whose install was moved or replaced meanwhile (exit 9)."""
from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from applier.errors import BadTargetError, IOFailure, StateCorruptError
from applier.store.fileops import NotRegularFile, io_failure, kind_of
from applier.store.heldroot import HeldRoot, hold


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
