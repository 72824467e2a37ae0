"""The journal: the only code that changes target files. Crash-safe, all-or-nothing.

A run writes, in this order: the originals it replaces (`backups/`) and the bytes every file will have and had
(`journal-data/`), then `journal.json` (the commit point: it says in words and data what is in flight, and the
state and overlay manifest to record at the end), then each target file (temp file + fsync + os.replace), then
removes folders the run emptied, then writes the overlay manifest and `state.json`, then removes the journal. A
process killed anywhere is finished by the next command (`recover`): each file already at its new bytes is left,
each still at its old bytes is written, and the temp files a killed write left behind are removed. An error (disk
full, permission) while files are being replaced rolls the written ones back at once.

This module decides what a run holds and in which order it is written; the state store (state.py) reads and
writes the run's files in `.applier/` (read_run, begin_run, end_run, drop_run) and holds the lock (locked).

Files are named by (root, relative path), never by an absolute path, and every name read back is resolved through
the target's Confinement: a crafted journal cannot make recovery write outside the target.
"""
from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from applier import __version__
from applier.errors import IOFailure, StateCorruptError
from applier.store.confine import Place, legacy_relative, missing_folders
from applier.store.failpoints import failpoint, hook
from applier.store.fsutil import (MAX_WALK_DEPTH, MAX_WALK_ENTRIES, NotRegularFile, check_writable,
                            io_failure, sha256_bytes)
from applier.store.heldroot import HeldRoot, is_temp_name
from applier.store.state import KEEP, SHA256, State, StateStore, dump_json

JOURNAL_FORMAT = 2


@dataclass
class FileOp:
    path: Path
    old: bytes | None          # None: the file does not exist before
    new: bytes | None          # None: the file is deleted

    @property
    def old_sha(self) -> str | None:
        return None if self.old is None else sha256_bytes(self.old)

    @property
    def new_sha(self) -> str | None:
        return None if self.new is None else sha256_bytes(self.new)


@dataclass(frozen=True)
class Backup:
    """A file of the state folder a run writes before any target file: an original's bytes under backups/."""
    name: str                  # relative to the state folder (state.backup_name)
    data: bytes
    original: os.stat_result | None   # the file's stat (None: unknown): the backup is no more readable than it


def execute(store: StateStore, ops: list[FileOp], new_state: State, description: str, *,
            manifest_after=KEEP, prune: tuple = (), backups: list[Backup] = ()) -> None:
    """Write `backups` into the state folder, replace every file of ops, record new_state (and the overlay
    manifest, None to remove it), then remove the folders of `prune` that the run left empty; or change nothing (a
    failure before the commit point removes what the run wrote in the state folder; one while files are replaced
    gives the ones written their old bytes back). Caller holds the target lock.

    Each path is checked once, here, and carried from then on as a Place: every write goes through its root's held
    handle, so a link swapped in after this check is refused at the write (the run is rolled back), never followed."""
    confinement = store.confinement
    places = [confinement.relative(op.path) for op in ops]    # refuses any path no patch or overlay may touch
    prune_places = [confinement.relative_dir(folder) for folder in prune]
    fresh = missing_folders(places)
    for place in places:
        check_writable(place.path)
    # journal-data/ holds the bytes every file will have and had; journal.json names them
    blobs, entries = [], []
    for n, (op, place) in enumerate(zip(ops, places)):
        entry = {"root": place.root, "relpath": place.relpath, "old_sha256": op.old_sha,
                 "new_sha256": op.new_sha, "old_bytes": None, "new_bytes": None}
        for side, data in (("old", op.old), ("new", op.new)):
            if data is not None:
                entry[f"{side}_bytes"] = f"{n:04d}.{side}"
                blobs.append((entry[f"{side}_bytes"], data))
        entries.append(entry)
    journal = {
        "format": JOURNAL_FORMAT,
        "applier_version": __version__,
        "what": description,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "how_to_read": "files listed here (relative to their root: the ComfyUI folder or site-packages) are "
                       "being replaced; the next applier command finishes the run: each file still at "
                       "old_sha256 gets the bytes in journal-data/<new_bytes>",
        "files": entries,
        "prune": [{"root": p.root, "relpath": p.relpath} for p in prune_places],
        "state_after": new_state.to_json(),
    }
    if manifest_after is not KEEP:
        journal["manifest_after"] = manifest_after
    store.begin_run(backups, blobs, dump_json(journal))
    failpoint("after-journal")

    done: list[tuple[Place, FileOp]] = []
    for op, place in zip(ops, places):
        try:
            store.check_roots()   # a moved or deleted install: stop; its journal goes with it and finishes there
            hook("before-write", place)
            place.held.replace(place.relpath, op.new)
        except (OSError, IOFailure) as exc:
            undo(store, done, exc, place, fresh)
        done.append((place, op))
        if len(done) == 1:
            failpoint("after-first-file")
    failpoint("after-files")
    finish(store, new_state, manifest_after, prune_places)


def undo(store: StateStore, done: list[tuple[Place, FileOp]], exc: BaseException, place: Place,
         fresh: list[Place]):
    """A write failed (disk full, permission, a link leading out swapped in): give the files already written their
    old bytes back, remove the folders the run created, drop the journal, then raise what failed. Should the
    rollback itself fail, the journal stays: the next command finishes the run."""
    try:
        for written, op in reversed(done):
            written.held.replace(written.relpath, op.old)
        for folder in fresh:
            folder.held.remove_if_empty(folder.relpath)
    except (OSError, IOFailure) as second:
        raise IOFailure(f"cannot replace {place}: {exc}; rolling back failed too ({second})",
                        hint="the journal in .applier/ is kept: fix the cause and run any applier command on the "
                             "install, which finishes the run") from exc
    store.drop_run()
    if isinstance(exc, NotRegularFile):
        raise IOFailure(exc.message.replace("nothing more was changed", "").rstrip(),
                        hint="the files this run had replaced got their old bytes back; nothing outside the install "
                             "was touched. " + (exc.hint or "")) from exc
    if isinstance(exc, IOFailure):
        raise exc
    raise io_failure(exc, place.path, "replace") from exc


def finish(store: StateStore, state_after: State, manifest_after, prune: list[Place]) -> None:
    """Remove the folders the run emptied, then record what it leaves (manifest, state) and remove the journal."""
    for folder in sorted(prune, key=lambda p: p.relpath.count("/"), reverse=True):
        folder.held.remove_if_empty(folder.relpath)
    hook("before-state", store)
    store.end_run(state_after, manifest_after)


def recover(store: StateStore) -> str | None:
    """Finish an interrupted run from its journal and remove the temp files killed writes left. Returns what was
    done, in words, or None when nothing was pending. Caller holds the target lock."""
    journal, state_after = store.read_run((1, JOURNAL_FORMAT))
    finished = None if journal is None else finish_interrupted(store, journal, state_after)
    swept = sweep_temp_files(store)
    if finished is None:
        return f"removed {swept} temp file(s) left by an interrupted run" if swept else None
    extra = f", {swept} temp file(s) removed" if swept else ""
    return f"finished an interrupted run ({journal.get('what', '?')}): {finished} file(s) completed{extra}"


def finish_interrupted(store: StateStore, journal: dict, state_after: State) -> int:
    """Each file of the journal still at its old bytes gets its new ones; then the run finishes. How many files
    were written."""
    entries, prune = read_journal(store, journal)
    finished = 0
    for place, entry in entries:
        current = place.sha256()
        if current == entry["new_sha256"]:
            continue
        if current != entry["old_sha256"]:
            raise StateCorruptError(
                f"interrupted run: {place} holds neither its old nor its new bytes (sha256 {current})",
                hint=f"someone changed it meanwhile; compare with {store.run_data} and fix by hand, "
                     f"then remove {store.journal_file}")
        new = None
        if entry["new_bytes"] is not None:
            new = store.read_run_blob(entry["new_bytes"])
            if new is None or sha256_bytes(new) != entry["new_sha256"]:
                raise StateCorruptError(f"journal data for {place} is missing or damaged",
                                        hint=f"see {store.journal_file}")
        try:
            hook("before-write", place)
            place.held.replace(place.relpath, new)
        except OSError as exc:
            raise io_failure(exc, place.path, "finish the interrupted run on") from exc
        finished += 1
    finish(store, state_after, journal.get("manifest_after", KEEP), prune)
    return finished


def read_journal(store: StateStore, journal) -> tuple[list[tuple[Place, dict]], list[Place]]:
    """The journal's files as validated (path, entry) pairs and its prune folders; StateCorruptError (nothing
    written) when any field is missing, mistyped, or names a place outside what the run could touch."""
    where = f"journal {store.journal_file}"

    def need(condition, message):
        if not condition:
            raise StateCorruptError(f"{where}: {message}",
                                    hint="inspect it by hand; the bytes it names are in journal-data/")

    # read_run checked that it is an object of a format this applier reads, with a valid state_after
    need(isinstance(journal.get("files"), list), "'files' is missing or not a list")
    need("manifest_after" not in journal or journal["manifest_after"] is None
         or isinstance(journal["manifest_after"], dict), "'manifest_after' is not an object")
    confinement = store.confinement
    out = []
    for entry in journal["files"]:
        need(isinstance(entry, dict), "a file entry is not an object")
        for key in ("old_sha256", "new_sha256", "old_bytes", "new_bytes"):
            need(key in entry, f"a file entry lacks {key!r}")
        for key in ("old_sha256", "new_sha256"):
            need(entry[key] is None or (isinstance(entry[key], str) and SHA256.fullmatch(entry[key])),
                 f"{key} is not a sha256")
        for key in ("old_bytes", "new_bytes"):
            need(entry[key] is None or is_blob_name(entry[key]), f"{key} is not a plain name in journal-data/")
        need((entry["new_bytes"] is None) == (entry["new_sha256"] is None), "new_bytes and new_sha256 disagree")
        if "relpath" in entry:
            root, relpath = entry.get("root"), entry["relpath"]
            need(isinstance(root, str), "a file entry lacks its root")
        else:  # format 1: an absolute path, trusted only inside this target
            need("path" in entry, "a file entry lacks 'relpath'")
            root, relpath = legacy_relative(entry["path"], confinement)
        out.append((confinement.resolve(root, relpath, what=where), entry))
    prune = []
    need(isinstance(journal.get("prune", []), list), "'prune' is not a list")
    for item in journal.get("prune", []):
        need(isinstance(item, dict) and isinstance(item.get("root"), str), "a prune entry is not {root, relpath}")
        prune.append(confinement.resolve_dir(item["root"], item.get("relpath"), what=where))
    return out, prune


BLOB_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")   # applier writes 0000.old, 0000.new


def is_blob_name(name) -> bool:
    """A plain file name in journal-data/: ASCII letters, digits, dot, dash and underscore, no separator, no "..",
    nothing a file system could not encode (a lone surrogate, a NUL)."""
    return isinstance(name, str) and BLOB_NAME.fullmatch(name) is not None


def temp_files(store: StateStore) -> list[tuple[HeldRoot, str]]:
    """Every temp file a killed write can have left: names of applier's own shape (heldroot.is_temp_name: a user's
    file never matches by chance), regular files, in .applier/ and in every folder a catalog patch or the overlay
    pack writes to, each folder walked through its root's handle (a link out of the root is not walked)."""
    found = []
    places = list(store.confinement.catalog_folder_places())
    trees = [(top.held, top.relpath) for top in store.confinement.overlay_top_places()]
    state = store.held()
    if state is not None:
        trees.append((state, ""))
    listings = []
    for place in places:
        try:
            names = place.held.listdir(place.relpath)
        except (OSError, IOFailure):
            continue
        listings.append((place.held, place.relpath, [(n, place.held.lstat(f"{place.relpath}/{n}"
                                                                          if place.relpath else n)) for n in names
                                                     if is_temp_name(n)]))
    for held, top in trees:
        try:
            for where, entries in held.walk(top, max_depth=MAX_WALK_DEPTH, max_entries=MAX_WALK_ENTRIES):
                listings.append((held, where, [(n, st) for n, st in entries if is_temp_name(n)]))
        except (OSError, IOFailure):
            continue
    for held, where, entries in listings:
        for name, st in entries:
            if st is not None and stat.S_ISREG(st.st_mode):
                found.append((held, f"{where}/{name}" if where else name))
    return found


def sweep_temp_files(store: StateStore) -> int:
    """Remove the temp files killed writes left (temp_files). Caller holds the target lock (a live run's temp file
    is never touched)."""
    removed = 0
    for held, rel in temp_files(store):
        try:
            if held.remove(rel, follow_last=False):
                removed += 1
        except (OSError, IOFailure):
            continue
    return removed


def needs_recovery(store: StateStore) -> bool:
    """A journal is pending, or a killed write left a temp file: a read-only command must recover first."""
    if os.path.lexists(store.journal_file) or os.path.lexists(store.run_data):
        return True
    return bool(temp_files(store))


def recover_if_pending(store: StateStore) -> str | None:
    """For read-only commands (status, list, verify, overlay list): finish an interrupted run first, under the
    target's lock, and only when there is one (a read of a target nobody is changing takes no lock)."""
    store.check_folder()
    if not needs_recovery(store):
        return None
    with store.locked(reader=True):
        return recover(store)

