"""The state folder `<target>/.applier/`: plain JSON and plain files a person can read and repair; every write into
it goes through the folder's held handle (StateStore's; a run's writer, writer.carry_out, is handed it), which
refuses links and special files anywhere inside it.

    .applier/state.json          what is applied: patch, variant, files (relative to their component root) with
                                 sha256 before/after, versions; its values and their validation are applied.py's
    .applier/backups/<patch id>/<component>/<relative path>    original bytes of every file a patch changed
    .applier/journal.json        only while an apply/revert is in flight: what is being done, in words and data
    .applier/displaced/<time>/...  bytes a forced revert moved aside (nothing the user wrote is lost)
    .applier/overlays.json       files installed by `applier overlay install` (the manifest)
    .applier/python.json         the interpreter the install was last worked on with (`--python`), reused
    .applier/.gitignore          `*`: git (plain clone, worktree, submodule) leaves the folder out of `git status`
                                 without applier ever writing into `.git`
    .applier/lock                the lock file of the target

The folder is applier's own: a symbolic link, FIFO, device or socket anywhere inside it (or `.applier` itself being
a link) is a refusal, exit 7, before anything is written, so no link can lead a write or a removal outside the
install and two installs can never share one state.
"""
from __future__ import annotations

import os
import re
import stat
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from applier.errors import IOFailure, StateCorruptError
from applier.store import lock
from applier.store.applied import (AppliedFile, AppliedPatch, Pending, State, backup_name, need, parse_json,
                                  pending_of)
from applier.store.confine import Confinement, Place
from applier.store.fsutil import (MAX_READ_BYTES, MAX_WALK_DEPTH, MAX_WALK_ENTRIES, NotRegularFile, dump_json,
                                  io_failure)
from applier.store.heldroot import HeldRoot, hold
from applier.store.statefolder import (KEEP, RunEnds, StoreLayout, check_roots, check_store, hold_install, identity,
                                       open_store, read_document)


class StateStore:
    """`.applier/` of one target. Every read is validated against the target's Confinement; every write and removal
    inside it walks from the folder down without following links; the install's roots are held by identity."""

    def __init__(self, state_dir: Path, confinement: Confinement, *, install_root: Path | None = None):
        self.dir = Path(state_dir)
        self.confinement = confinement
        self.install_root = Path(install_root) if install_root is not None else self.dir.parent
        self._identities: dict | None = None
        self._install: HeldRoot | None = None
        self._held: HeldRoot | None = None

    @property
    def install(self) -> HeldRoot:
        """The install's root folder, held from the first time the store needs it (the command's opening) to
        release."""
        if self._install is None:
            self._install = hold_install(self.install_root)
        return self._install

    @property
    def identities(self) -> dict:
        """The install's roots as this command first opened them ({path: (device, inode)}): every run checks them."""
        if self._identities is None:
            self._identities = {path: identity(path) for path in self.held_roots()}
        return self._identities

    def release(self) -> None:
        """Close the state folder's handle and the install's."""
        self.close()
        if self._install is not None:
            self._install.close()
            self._install = None

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.dir / "journal.json"

    @property
    def backups(self) -> Path:
        return self.dir / "backups"

    @property
    def displaced(self) -> Path:
        return self.dir / "displaced"

    @property
    def overlay_manifest(self) -> Path:
        return self.dir / "overlays.json"

    @property
    def interpreter_file(self) -> Path:
        return self.dir / "python.json"

    @property
    def lock_file(self) -> Path:
        return self.dir / "lock"

    # -------------------------------------------------------------- the folder's own discipline

    def check_folder(self) -> None:
        """Refuse (exit 7) when `.applier` is not a real folder or holds a link or a special file anywhere."""
        folder = check_store(self.install, self.layout)
        if folder is not None:
            self.handle = folder

    @property
    def handle(self) -> HeldRoot | None:
        """The state folder's handle as held now (None: not opened, or the folder is absent)."""
        return self._held

    @handle.setter
    def handle(self, folder: HeldRoot | None) -> None:
        """The state folder's handle from now on (one opened and checked just now; None: the folder is absent): the
        one it replaces is closed."""
        if self._held is not None and self._held is not folder:
            self._held.close()
        self._held = folder

    @property
    def layout(self) -> StoreLayout:
        return StoreLayout(name=self.dir.name, shown=self.dir, lock_name=self.lock_file.name, gitignore=GITIGNORE,
                           journal_name=self.journal_file.name, data_name=self.run_data.name,
                           state_name=self.state_file.name, manifest_name=self.overlay_manifest.name,
                           documents=(self.journal_file.name, self.state_file.name), document_limit=MAX_JSON_BYTES,
                           max_depth=MAX_WALK_DEPTH, max_entries=MAX_WALK_ENTRIES)

    def guard(self, path: Path) -> str:
        """The path of `path` relative to the state folder (the form every operation on it takes), once it is
        lexically inside it (StateCorruptError otherwise). Links are the handle's to refuse: it holds the folder
        with links refused, at every component of every operation."""
        path = Path(path)
        if path != self.dir and self.dir not in path.parents:
            raise StateCorruptError(f"refusing to write {path}: it is not inside {self.dir}",
                                    hint="a bug: please report it")
        return path.relative_to(self.dir).as_posix()

    def held(self, *, create: bool = False) -> HeldRoot | None:
        """The state folder as a held handle, opened from the install's own handle without following a link (links
        anywhere below it are refused by the handle); None when it does not exist and create is False; created
        0700."""
        if self._held is not None:
            return self._held
        name = self.dir.name
        try:
            if not create and self.install.lstat(name) is None:
                return None
            self._held = self.install.subroot(name, links=False, create=create)
        except (NotADirectoryError, NotRegularFile) as exc:
            raise StateCorruptError(f"{self.dir} is not a real folder (a link or a file stands there)",
                                    hint="nothing was changed; move it aside by hand") from exc
        return self._held

    def _op(self, action: str, path: Path, do):
        """do(handle, relpath) on the state folder's handle; a link met there is a refusal (exit 7)."""
        rel = self.guard(path)
        try:
            return do(self.held(create=True), rel)
        except NotRegularFile as exc:
            raise StateCorruptError(exc.message, hint=exc.hint) from exc

    def make_folder(self, folder: Path) -> None:
        """Create folder (and the ones above it, inside the state folder), each step on the held handle."""
        fresh = self._held is None and not os.path.lexists(self.dir)
        self._op("create", folder, lambda held, rel: held.make_folders(rel, mode=0o700))
        if fresh:
            self.write_gitignore()

    def write(self, path: Path, data: bytes, *, mode: int = 0o600) -> None:
        if self._held is None and not os.path.lexists(self.dir):
            self.make_folder(self.dir)
        self._op("write", path, lambda held, rel: held.write(rel, data, mode=mode))

    def read(self, path: Path, *, limit: int) -> bytes | None:
        """A file of the state folder, None when absent; StateCorruptError for a link or a special file there."""
        if self.held() is None:
            return None
        try:
            return self._op("read", path, lambda held, rel: held.read(rel, limit=limit))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def remove(self, path: Path) -> None:
        if self.held() is not None:
            self._op("remove", path, lambda held, rel: held.remove(rel, follow_last=False))

    def remove_tree(self, path: Path) -> None:
        if self.held() is None:
            return
        if Path(path) == self.dir:
            self.close()
            self.install.remove_tree(self.dir.name)
            return
        self._op("remove", path, lambda held, rel: held.remove_tree(rel))

    def prune_empty(self, folder: Path) -> None:
        """Remove every empty folder at or below folder (inside the state folder), never through a link."""
        if self.held() is not None and os.path.lexists(folder):
            self._op("remove", folder, lambda held, rel: held.prune_empty(rel))

    def rename(self, src: Path, dst: Path) -> None:
        self._op("move", src, lambda held, rel: held.rename(rel, self.guard(dst)))

    def new_folder(self, base: Path) -> Path:
        """A folder that did not exist before: base, or base-2, base-3, ... (created exclusively, so two runs in the
        same second never share one)."""
        self.make_folder(base.parent)
        for n in range(1, 10_000):
            folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                self._op("create", folder, lambda held, rel: held.make_folder_exclusive(rel, mode=0o700))
                return folder
            except FileExistsError:
                continue
        raise StateCorruptError(f"{base.parent} holds 10,000 folders named {base.name}-N",
                                hint="move old ones aside by hand")

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def ensure(self) -> None:
        """The state folder exists, 0700 (a looser one is tightened: backups hold the install's files, private ones
        among them), with its .gitignore, and holds no link or special file (exit 7)."""
        self.open_run(None, read=False)

    def write_gitignore(self) -> None:
        """Create .gitignore once, in one write and without a temp file: it is written before the lock is taken,
        and a recovering run (which holds it) sweeps temp files; a concurrent creator's copy is just as good."""
        self._op("create", self.dir / ".gitignore",
                 lambda held, rel: held.create_exclusive(rel, GITIGNORE, mode=0o644))

    # -------------------------------------------------------------- the lock

    @contextmanager
    def locked(self, *, reader: bool = False, timeout: float | None = None):
        """Hold the target's lock (open_run, reading nothing) until the block ends."""
        with ExitStack() as stack:
            self.open_run(stack, reader=reader, timeout=timeout, read=False)
            yield

    def open_run(self, stack: ExitStack | None, *, create: bool = True, reader: bool = False,
                 timeout: float | None = None, read: bool = True) -> Pending | None:
        """Open the folder for a command that may write, in one pass (statefolder.open_store): the install's root held
        and its roots checked (exit 9), the folder checked (no link or special file in it: exit 7) and created inside
        the install, never above it (a deleted install is not recreated), the lock taken (lock.take, held on stack
        until the command is done; stack None: the caller holds it), then, with read, the state and an interrupted
        run read once (Pending). None when create is False and the folder does not exist, or read is False."""
        layout, root_paths = self.layout, self.held_roots()

        def take_lock(open_fd):
            stack.enter_context(lock.take(open_fd, self.lock_file, reader=reader, timeout=timeout))

        opened = open_store(layout, install=self.install, roots=self._identities, root_paths=root_paths,
                            create=create, take_lock=take_lock if stack is not None else None, read=read)
        self._identities = opened.roots
        self.handle = opened.folder
        if opened.folder is None or not read:
            return None
        return pending_of(opened, layout, self.confinement)

    # -------------------------------------------------------------- one run's files (journal.py says what they hold)

    @property
    def run_data(self) -> Path:
        return self.dir / "journal-data"

    def read_pending(self) -> Pending:
        """The state and an interrupted run, read once (open_run's reading, the caller holding the lock)."""
        return self.open_run(None)

    def run_ends(self, state: State, manifest=KEEP) -> RunEnds:
        """What a run needs of this folder, read once before it is planned (statefolder.RunEnds): its held handle, as
        the command's opening checked it (open_run; ensured here when it was not open: created inside the install,
        0700, its .gitignore, no link or special file in it, exit 7), the install's roots as opened, and the state
        (and overlay manifest: KEEP, None to remove it) to record."""
        if self._held is None:
            self.ensure()
        return RunEnds(self._held, self.layout, dict(self.identities), state.to_json(), manifest)

    # -------------------------------------------------------------- the install's identity

    def held_roots(self) -> list[Path]:
        roots = [self.install_root, *(p for p in self.confinement.roots.values() if p is not None)]
        return list(dict.fromkeys(roots))

    def check_roots(self) -> None:
        """BadTargetError (exit 9) when an install root is no longer the folder this command opened."""
        check_roots(self.identities)

    # -------------------------------------------------------------- documents

    def fingerprint(self) -> tuple:
        """What changes when a run records anything: the state file's identity and whether a journal is pending."""
        try:
            st = os.lstat(self.state_file)
            state = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            state = None
        return state, os.path.lexists(self.journal_file)

    def read_json(self, path: Path):
        """A JSON document of the state folder, read through its handle (read_json's rules)."""
        return read_json(path, reader=lambda: self.read(path, limit=MAX_JSON_BYTES))

    def load(self) -> State:
        self.check_folder()
        data = self.read_json(self.state_file)
        if data is None:
            return State()
        return State.from_json(data, self.confinement, what=f"state file {self.state_file}")

    def save(self, state: State) -> None:
        self.ensure()
        self.write(self.state_file, dump_json(state.to_json()))

    def path_of(self, record: AppliedPatch, f: AppliedFile) -> Place:
        """The file's place in this target (validated: the state may have been crafted)."""
        return self.confinement.resolve(record.root, f.relpath)

    def backup_path(self, patch_id: str, component: str, relpath: str) -> Path:
        return self.dir / backup_name(patch_id, component, relpath)

    def read_backup(self, record: AppliedPatch, f: AppliedFile) -> bytes | None:
        """The backup's bytes; None when missing or when it is not a plain file inside .applier/backups/."""
        if f.backup is None:
            return None
        path = self.backup_path(record.id, record.component, f.relpath)
        try:
            return self.read(path, limit=MAX_READ_BYTES)
        except (OSError, StateCorruptError, IOFailure):
            return None

    def save_displaced(self, displaced: list[tuple[Path, bytes]]) -> Path:
        """Save bytes a forced operation is about to replace under displaced/<time>[-N]/<root>/<relpath>: a folder
        of its own (never one an earlier run of the same second wrote), each copy no more readable than the file
        it came from."""
        try:
            folder = self.new_folder(self.displaced / time.strftime("%Y%m%d-%H%M%S"))
        except OSError as exc:
            raise io_failure(exc, self.displaced, "save the displaced bytes to") from exc
        for path, data in displaced:
            place = self.confinement.relative(path)
            dest = folder / place.root / place.relpath
            try:
                self.write(dest, data, mode=private_mode(place.held.stat(place.relpath)))
            except OSError as exc:
                raise io_failure(exc, dest, "save the displaced bytes to") from exc
        return folder

    # -------------------------------------------------------------- the interpreter

    def record_interpreter(self, python: Path) -> None:
        self.ensure()
        self.write(self.interpreter_file, dump_json({
            "python": str(python),
            "why": "the interpreter `--python` named for this install; applier uses it whenever none is given"}))


def read_interpreter(state_dir: Path) -> Path | None:
    """The interpreter recorded for the install whose state folder this is, validated like any recorded path (an
    absolute path named like a Python interpreter, read without following a link); None when none is recorded."""
    path = Path(state_dir) / "python.json"
    data = read_state_document(path)
    if data is None:
        return None
    need(isinstance(data, dict) and isinstance(data.get("python"), str), f"{path}: no 'python' string")
    value = data["python"]
    need(len(value) < 4096 and "\x00" not in value and os.path.isabs(value), f"{path}: 'python' is not an absolute path")
    need(INTERPRETER_NAME.fullmatch(Path(value).name) is not None,
         f"{path}: {Path(value).name!r} is not the name of a Python interpreter")
    return Path(value)


def read_state_document(path: Path):
    """A JSON document of a state folder read before any StateStore exists (read_json's rules), through a handle on
    the install: `.applier` reached without following a link and held with links refused. None when the folder or
    the file is absent; StateCorruptError for a link or a special file on the way."""
    path = Path(path)
    state_dir = path.parent
    try:
        held = hold(state_dir.parent).subroot(state_dir.name, links=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except NotRegularFile as exc:
        raise StateCorruptError(exc.message, hint=exc.hint) from exc
    try:
        def reader():
            try:
                return held.read(path.name, limit=MAX_JSON_BYTES)
            except (FileNotFoundError, NotADirectoryError):
                return None
        return read_json(path, reader=reader)
    finally:
        held.close()


INTERPRETER_NAME = re.compile(r"python[0-9.]*(\.exe)?|pythonw?(\.exe)?|pypy[0-9.]*")
GITIGNORE = b"# applier's state folder: kept out of git by this file (applier never writes into .git)\n*\n"


def private_mode(st: os.stat_result | None) -> int:
    """The mode of a copy of a file (a backup, displaced bytes): its read and write bits, never more (no execute,
    no setuid), so a copy is never more readable than its original; 0600 when the original is unknown."""
    return 0o600 if st is None else stat.S_IMODE(st.st_mode) & 0o666


MAX_JSON_BYTES = 16 * 1024 * 1024


def read_json(path: Path, *, reader):
    """The parsed JSON of path as reader() (a read through a held handle) returns it, None when it does not exist;
    StateCorruptError when it is not a regular file (a link, a FIFO, a device), too large, nested too deeply,
    unreadable or not JSON."""
    raw = read_document(reader, path)
    return None if raw is None else parse_json(raw, path)
