"""One install, opened once per command: its held roots, its state store (`.applier/`), its lock and its journal.

The command's entry opens it (open_install, a context manager) from the target it resolved once; the operations
receive it and ask it. They never rebuild a store, an allow-list or a root from a path: what the install may touch
(its Confinement) is fixed when it is opened.
"""
from __future__ import annotations

from contextlib import contextmanager

from applier.store import journal
from applier.store.confine import Confinement
from applier.store.journal import FileOp
from applier.store.state import State, StateStore
from applier.target import Target


class Install:
    """The target (as detected) and its state store, held for one command. `transaction` takes the lock and
    finishes any interrupted run; `execute` hands the file operations to the journal in one go."""

    def __init__(self, target: Target, confinement: Confinement):
        self.target = target
        self.store = StateStore(target.state_dir, confinement, install_root=target.root)

    def __enter__(self) -> "Install":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()
        self.store.install.close()

    @property
    def confinement(self) -> Confinement:
        return self.store.confinement

    @property
    def root(self):
        return self.target.root

    def has_state(self) -> bool:
        """Whether `.applier/` exists (after check_folder refused a link or a special file there)."""
        self.store.check_folder()
        return self.store.dir.exists()

    @contextmanager
    def transaction(self, *, reader: bool = False, dry_run: bool = False):
        """The install's lock held, any interrupted run finished (or rolled back) first; yields (what recovery did,
        in words or None, the state as recorded). A dry run on an install without `.applier/` creates nothing: it
        yields (None, the empty state) without a lock."""
        if dry_run and not self.has_state():
            yield None, State()
            return
        with self.store.locked(reader=reader):
            recovered = journal.recover(self.store)
            yield recovered, self.store.load()

    def execute(self, ops: list[FileOp], new_state: State, description: str, **kwargs) -> None:
        """The journal's one run: ops written, new_state recorded, or nothing changed. Inside transaction()."""
        journal.execute(self.store, ops, new_state, description, **kwargs)

    def record_interpreter(self, python) -> None:
        """Record the interpreter `--python` named for this install, under its lock."""
        with self.store.locked():
            self.store.record_interpreter(python)

    def recover_if_pending(self) -> str | None:
        """For read-only commands: finish an interrupted run first, under the lock, only when there is one."""
        return journal.recover_if_pending(self.store)

    def needs_recovery(self) -> bool:
        return journal.needs_recovery(self.store)


@contextmanager
def open_install(target: Target, confinement: Confinement):
    """The install of target, opened once, closed when the command is done."""
    install = Install(target, confinement)
    try:
        yield install
    finally:
        install.close()
