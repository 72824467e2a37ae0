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

import hashlib
import stat
from dataclasses import dataclass, field, replace

from applier.errors import IOFailure, StateCorruptError
from applier.store.failpoints import HOOK_NAMES, HOOKS, failpoint
from applier.store.confine import Sweep
from applier.store.fileops import MAX_READ_BYTES, NotRegularFile, dump_json, io_failure, is_temp_name
from applier.store.heldroot import HeldRoot, parts_of
from applier.store.statefolder import StoreLayout, check_roots, state_folder_refusals


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


def call_hook(name: str, arg) -> None:
    """The race tests' hook at this point of the run (failpoints.HOOKS; none outside tests)."""
    assert name in HOOK_NAMES, name
    function = HOOKS.get(name)
    if function is not None:
        function(arg)
