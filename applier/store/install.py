"""One install, opened once per command: its held roots, its state store (`.applier/`), its lock and its journal.

The command's entry opens it (open_install, a context manager) from the target it resolved once. A command that
changes the install opens it with `run`: the lock is taken, an interrupted run is finished (or rolled back) and the
state is read, once, before the operation starts, and the lock is held until the command is done. The operations
receive it and ask it (`state`, `recovered`, `execute`). They never rebuild a store, an allow-list or a root from a
path: what the install may touch (its Confinement) is fixed when it is opened.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

from applier.store import journal, writer
from applier.store.applied import State
from applier.store.confine import Confinement
from applier.store.journal import Backup, FileOp
from applier.store.state import StateStore
from applier.store.statefolder import KEEP
from applier.target import Target


class Install:
    """The target (as detected) and its state store, held for one command, opened on creation: with `run`, the state
    folder is opened once (StateStore.open_run: the lock taken and held until close, then the state and any
    interrupted run read in one pass) and that run finished (journal.finish: planned as data, written by
    writer.carry_out); create=False: only where `.applier/` exists, elsewhere nothing is created and the state is
    empty (a dry run, a revert with nothing recorded). `execute` hands a run's file operations to the journal in one
    go. Everything it holds (the lock, the handles) is released by close, in reverse order."""

    def __init__(self, target: Target, confinement: Confinement, *, run: bool = False, create: bool = True):
        self.target = target
        self.store = StateStore(target.state_dir, confinement, install_root=target.root)
        self.state = State()             # as recorded, once the run is open
        self.recovered: str | None = None  # what finishing an interrupted run did, in words
        self.locked = False
        self._held = ExitStack()
        self._held.callback(self.store.release)
        try:
            pending = self.store.open_run(self._held, create=create) if run else None
            if pending is not None:
                self.locked = True
                self.recovered = journal.finish(confinement, pending)
                self.state = pending.state
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Install":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.locked = False
        self._held.close()

    @property
    def confinement(self) -> Confinement:
        return self.store.confinement

    @property
    def root(self):
        return self.target.root

    def execute(self, ops: list[FileOp], new_state: State, description: str, *, manifest_after=KEEP,
                prune: tuple = (), backups: list[Backup] = ()) -> None:
        """One run: planned whole by the journal, then written by the writer; ops written, new_state (and
        manifest_after, unless KEEP) recorded, the folders of prune removed where the run left them empty; or
        nothing changed. On an install opened with run."""
        assert self.locked, "execute() needs the lock an install opened with run holds"
        ends = self.store.run_ends(new_state, manifest_after)
        run = journal.plan(ends, self.confinement, ops, description, prune=prune, backups=backups)
        writer.carry_out(run)
        self.state = new_state

    def record_interpreter(self, python) -> None:
        """Record the interpreter `--python` named for this install, under its lock."""
        if self.locked:
            self.store.record_interpreter(python)
            return
        with self.store.locked():
            self.store.record_interpreter(python)

    def recover_if_pending(self) -> str | None:
        """For read-only commands: finish an interrupted run first, under the lock, only when there is one."""
        return journal.recover_if_pending(self.store)

    def needs_recovery(self) -> bool:
        return journal.needs_recovery(self.store)


@contextmanager
def open_install(target: Target, confinement: Confinement, *, run: bool = False, create: bool = True):
    """The install of target, opened once (Install: with `run`, locked, recovered, its state read), closed when the
    command is done."""
    install = Install(target, confinement, run=run, create=create)
    try:
        yield install
    finally:
        install.close()
