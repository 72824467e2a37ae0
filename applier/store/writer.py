"""A run's one writer, beside the journal that plans it (journal.plan gives it a `Run`: the backups, journal.json and
its blobs, each target file as a Place with its old and new bytes, the state to record), written through the held
handles in this order, all or nothing; nothing else writes a run.

In this order: the originals it replaces (`backups/`) and the bytes every file will have and had (`journal-data/`),
then `journal.json` (the commit point), then each target file (temp file + fsync + os.replace), then the folders
the run emptied, then the overlay manifest and `state.json`, then the journal is removed. An error (disk full,
permission, a link swapped in) before the commit point removes what the run wrote; one while files are replaced
gives the written ones their old bytes back. A run committed already (an interrupted one that recovery finishes)
has nothing to roll back: an error leaves its journal for the next command. Every write into the state folder goes
through its handle, which refuses links anywhere inside it (exit 7); before every write the install's roots are
checked to be the folders the command opened (exit 9)."""
from __future__ import annotations

import stat
from dataclasses import dataclass, field

from applier.errors import IOFailure
from applier.store import statefolder
from applier.store.confine import Sweep
from applier.store.failpoints import call_hook, failpoint
from applier.store.fileops import NotRegularFile, io_failure, is_temp_name
from applier.store.heldroot import HeldRoot
from applier.store.statefolder import RunEnds, check_roots


@dataclass
class Write:
    """One target file of a run: its place (a confine.Place) and the bytes it has (None: absent) and will have
    (None: removed). For a run committed already (recovery): expect, the (old, new) sha256 the journal recorded (the
    file is written only while it still holds its old bytes: journal.still_to_write), and blob, the name in
    journal-data/ of its new bytes (read only then)."""
    place: object               # confine.Place
    old: bytes | None
    new: bytes | None
    expect: tuple | None = None
    blob: str | None = None


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
    sweep: Sweep | None = None                    # temp files recovery removes after carry_out (sweep_temp_files)
    made: list = field(default_factory=list)      # backups the run created (none was there): gone on a rollback


def carry_out(run: Run) -> int:
    """Write the run, or change nothing (before the commit point, and on a failure while files are replaced); a
    committed run's failure leaves its journal, which the next command finishes. A run committed already (ends set,
    no journal: recovery) holds only the files still at their old bytes (journal.still_to_write checked every file
    first); a run with no ends writes nothing. After the files, the folders the run emptied are removed (deepest
    first), then finish records the run. Returns how many target files were written; run.sweep is left to the
    caller (journal.finish sweeps right after). Caller holds the target lock."""
    fresh_run = run.journal is not None
    if fresh_run:       # the backups and journal-data/, then journal.json: the commit point; roots checked before each
        check_roots(run.ends.roots)
        written = statefolder.stage(run.ends, run.backups, run.blobs, run.made)
        failpoint("after-backups")
        check_roots(run.ends.roots)
        statefolder.write_journal(run.ends, run.journal, written)
        failpoint("after-journal")
    done: list[Write] = []
    for write in run.files:
        try:
            check_roots(run.ends.roots)   # a moved or deleted install: stop; its journal goes with it, finishes there
            call_hook("before-write", write.place)
            write.place.held.replace(write.place.relpath, write.new)
        except (OSError, IOFailure) as exc:
            if not fresh_run:
                if isinstance(exc, IOFailure):
                    raise
                raise io_failure(exc, write.place.path, "finish the interrupted run on") from exc
            try:        # roll back: the files written get their old bytes back, the folders the run created go
                for written in reversed(done):
                    written.place.held.replace(written.place.relpath, written.old)
                for folder in run.fresh:
                    folder.held.remove_if_empty(folder.relpath)
            except (OSError, IOFailure) as second:      # the journal stays: the next command finishes the run
                raise IOFailure(f"cannot replace {write.place}: {exc}; rolling back failed too ({second})",
                                hint=ROLLBACK_FAILED) from exc
            statefolder.discard(run.ends, run.made)     # the journal, and the originals it backed up
            raise rolled_back_failure(exc, write.place)
        done.append(write)
        if fresh_run and len(done) == 1:
            failpoint("after-first-file")
    if fresh_run:
        failpoint("after-files")
    if run.ends is not None:
        for place in sorted(run.prune, key=lambda p: p.relpath.count("/"), reverse=True):
            place.held.remove_if_empty(place.relpath)     # the folders the run emptied, deepest first
        finish(run)
    return len(done)


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
    """Remove the temp files killed writes left (temp_files); recovery (journal.finish) calls it after carry_out,
    the caller holding the target lock (a live run's temp file is never touched). Returns how many were removed."""
    removed = 0
    for held, rel in temp_files(sweep):
        try:
            if held.remove(rel, follow_last=False):
                removed += 1
        except (OSError, IOFailure):
            continue
    return removed


ROLLBACK_FAILED = ("the journal in .applier/ is kept: fix the cause and run any applier command on the install, which "
                   "finishes the run")


def rolled_back_failure(exc: BaseException, place) -> IOFailure:
    """What a fresh run raises for exc, a failure while its files were replaced (a full disk, a permission, a link
    leading out swapped in), once carry_out has rolled it back: the files it had replaced have their old bytes
    again, the folders it created and its journal and new backups are gone. An IOFailure is raised as it is."""
    if isinstance(exc, NotRegularFile):
        failure = IOFailure(exc.message.replace("nothing more was changed", "").rstrip(),
                            hint="the files this run had replaced got their old bytes back; nothing outside the "
                                 "install was touched. " + (exc.hint or ""))
    elif isinstance(exc, IOFailure):
        return exc
    else:
        failure = io_failure(exc, place.path, "replace")
    failure.__cause__ = exc      # as `raise failure from exc`
    return failure


def finish(run: Run) -> None:
    """Record what the run leaves (manifest, state), then remove the journal (carry_out removed the folders the run
    emptied first)."""
    call_hook("before-state", run.ends)
    statefolder.record(run.ends)
    failpoint("after-state")
    statefolder.drop_finished(run.ends)

