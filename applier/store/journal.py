"""The journal: the only code that changes target files. Crash-safe, all-or-nothing.

A run writes, in this order: the bytes every file will have and had (`journal-data/`), then `journal.json` (the
commit point: it says in words and data what is in flight, and the state and overlay manifest to record at the
end), then each target file (temp file + fsync + os.replace), then the overlay manifest, then `state.json`, then
removes folders the run emptied, then the journal. A process killed anywhere is finished by the next command
(`recover`): each file already at its new bytes is left, each still at its old bytes is written, and the temp
files a killed write left behind are removed. An error (disk full, permission) while files are being replaced
rolls the written ones back at once.

Files are named by (root, relative path), never by an absolute path, and every name read back is resolved through
the target's Confinement: a crafted journal cannot make recovery write outside the target.
"""
from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from applier import __version__
from applier.errors import IOFailure, StateCorruptError
from applier.store.confine import Place, legacy_relative
from applier.store.failpoints import failpoint, hook
from applier.store.fsutil import (MAX_READ_BYTES, MAX_WALK_DEPTH, MAX_WALK_ENTRIES, NotRegularFile, check_writable,
                            io_failure, remove_stale_bytecode_at, sha256_bytes)
from applier.store.heldroot import HeldRoot, is_temp_name
from applier.store.lock import target_lock
from applier.store.state import SHA256, State, StateStore, check_format, dump_json

JOURNAL_FORMAT = 2
KEEP = object()              # manifest_after: leave the overlay manifest as it is


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


def data_dir(store: StateStore) -> Path:
    return store.dir / "journal-data"


def execute(store: StateStore, ops: list[FileOp], new_state: State, description: str, *,
            manifest_after=KEEP, prune: tuple = ()) -> None:
    """Replace every file of ops, record new_state (and the overlay manifest, None to remove it), then remove the
    folders of `prune` that the run left empty; or change nothing. Caller holds the target lock.

    Each path is checked once, here, and carried from then on as a Place: every write goes through its root's held
    handle, so a link swapped in after this check is refused at the write (the run is rolled back), never followed."""
    confinement = store.confinement
    places = [confinement.relative(op.path) for op in ops]    # refuses any path no patch or overlay may touch
    prune_places = [confinement.relative_dir(folder) for folder in prune]
    for place in places:
        check_writable(place.path)
    store.check_roots()
    payload_dir = data_dir(store)
    entries = []
    try:
        store.remove_tree(payload_dir)
        store.make_folder(payload_dir)
        for n, (op, place) in enumerate(zip(ops, places)):
            entry = {"root": place.root, "relpath": place.relpath, "old_sha256": op.old_sha,
                     "new_sha256": op.new_sha, "old_bytes": None, "new_bytes": None}
            for side, data in (("old", op.old), ("new", op.new)):
                if data is not None:
                    name = f"{n:04d}.{side}"
                    store.write(payload_dir / name, data, mode=0o600)
                    entry[f"{side}_bytes"] = name
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
        failpoint("after-backups")
        store.check_roots()
        store.write(store.journal_file, dump_json(journal), mode=0o600)
    except OSError as exc:
        store.remove_tree(payload_dir)
        raise io_failure(exc, store.dir, "write the journal in") from exc
    failpoint("after-journal")

    done: list[tuple[Place, FileOp]] = []
    fresh = missing_folders(places)
    for op, place in zip(ops, places):
        try:
            store.check_roots()   # a moved or deleted install: stop; its journal goes with it and finishes there
            hook("before-write", place)
            write_target(place, op.new)
        except (OSError, IOFailure) as exc:
            undo(store, done, exc, place, fresh)
        done.append((place, op))
        if len(done) == 1:
            failpoint("after-first-file")
    failpoint("after-files")
    finish(store, journal, prune_places)


def missing_folders(places: list[Place]) -> list[Place]:
    """The folders the run's writes will create (they do not exist yet), deepest first: a rolled-back run removes
    them again when it leaves them empty."""
    out = {}
    for place in places:
        parts = place.relpath.split("/")[:-1]
        while parts:
            rel = "/".join(parts)
            try:
                there = place.held.lstat(rel) is not None
            except (OSError, IOFailure):
                there = True
            if there:
                break
            out[(place.root, rel)] = Place(place.root, rel, place.held)
            parts.pop()
    return sorted(out.values(), key=lambda p: p.relpath.count("/"), reverse=True)


def undo(store: StateStore, done: list[tuple[Place, FileOp]], exc: BaseException, place: Place,
         fresh: list[Place]):
    """A write failed (disk full, permission, a link leading out swapped in): give the files already written their
    old bytes back, remove the folders the run created, drop the journal, then raise what failed. Should the
    rollback itself fail, the journal stays: the next command finishes the run."""
    try:
        for written, op in reversed(done):
            write_target(written, op.old)
        for folder in fresh:
            remove_if_empty(folder)
    except (OSError, IOFailure) as second:
        raise IOFailure(f"cannot replace {place}: {exc}; rolling back failed too ({second})",
                        hint="the journal in .applier/ is kept: fix the cause and run any applier command on the "
                             "install, which finishes the run") from exc
    clear(store)
    if isinstance(exc, NotRegularFile):
        raise IOFailure(exc.message.replace("nothing more was changed", "").rstrip(),
                        hint="the files this run had replaced got their old bytes back; nothing outside the install "
                             "was touched. " + (exc.hint or "")) from exc
    if isinstance(exc, IOFailure):
        raise exc
    raise io_failure(exc, place.path, "replace") from exc


def finish(store: StateStore, journal: dict, prune: list[Place]) -> None:
    """Record what a run leaves (manifest, state), remove the folders it emptied, then the journal."""
    hook("before-state", store)
    try:
        if "manifest_after" in journal:
            write_manifest(store, journal["manifest_after"])
        store.save(State.from_json(journal["state_after"], store.confinement, what="the journal's state_after"))
    except OSError as exc:
        raise io_failure(exc, store.dir, "record the state in") from exc
    failpoint("after-state")
    for folder in sorted(prune, key=lambda p: p.relpath.count("/"), reverse=True):
        remove_if_empty(folder)
    clear(store)


def write_manifest(store: StateStore, data: dict | None) -> None:
    if data is None:
        store.remove(store.overlay_manifest)
    else:
        store.write(store.overlay_manifest, dump_json(data), mode=0o600)


def write_target(place: Place, data: bytes | None) -> None:
    """Give the file its new bytes (None: remove it), through its root's held handle. A symlink stays a symlink:
    the file it points to inside the root gets the bytes; one leading outside is refused (LeadsOutside)."""
    held = place.held
    try:
        resolved = "/".join(held.resolved(place.relpath))
    except (FileNotFoundError, NotADirectoryError):     # a new file in folders the write creates
        resolved = place.relpath
    if data is None:
        held.remove(place.relpath)
    else:
        held.write(place.relpath, data)
    for rel in dict.fromkeys((place.relpath, resolved)):
        remove_stale_bytecode_at(held, rel)


def clear(store: StateStore) -> None:
    store.remove(store.journal_file)
    store.remove_tree(data_dir(store))


def remove_if_empty(folder: Place) -> None:
    """Remove a folder the run emptied: its __pycache__ first when nothing is left there (write_target removed the
    bytecode of every file it removed), then the folder itself when nothing is left. A folder holding anything (a
    user's file, a user's bytecode) stays; nothing is followed through a link."""
    for rel in (f"{folder.relpath}/__pycache__", folder.relpath):
        try:
            folder.held.rmdir(rel)
        except (OSError, IOFailure):    # a link leading out on the way: nothing there is this run's
            return


def pending(store: StateStore) -> dict | None:
    """The journal of an interrupted run, None when there is none."""
    store.check_folder()
    return store.read_json(store.journal_file)


def recover(store: StateStore) -> str | None:
    """Finish an interrupted run from its journal and remove the temp files killed writes left. Returns what was
    done, in words, or None when nothing was pending. Caller holds the target lock."""
    journal = pending(store)
    if journal is None:
        if os.path.lexists(data_dir(store)):  # killed before the commit point: no target file was touched
            store.remove_tree(data_dir(store))
        swept = sweep_temp_files(store)
        return f"removed {swept} temp file(s) left by an interrupted run" if swept else None
    entries, prune = read_journal(store, journal)
    finished = 0
    for place, entry in entries:
        current = place_sha(place)
        if current == entry["new_sha256"]:
            continue
        if current != entry["old_sha256"]:
            raise StateCorruptError(
                f"interrupted run: {place} holds neither its old nor its new bytes (sha256 {current})",
                hint=f"someone changed it meanwhile; compare with {data_dir(store)} and fix by hand, "
                     f"then remove {store.journal_file}")
        new = None
        if entry["new_bytes"] is not None:
            new = read_blob(store, entry["new_bytes"])
            if new is None or sha256_bytes(new) != entry["new_sha256"]:
                raise StateCorruptError(f"journal data for {place} is missing or damaged",
                                        hint=f"see {store.journal_file}")
        try:
            hook("before-write", place)
            write_target(place, new)
        except OSError as exc:
            raise io_failure(exc, place.path, "finish the interrupted run on") from exc
        finished += 1
    finish(store, journal, prune)
    swept = sweep_temp_files(store)
    extra = f", {swept} temp file(s) removed" if swept else ""
    return f"finished an interrupted run ({journal.get('what', '?')}): {finished} file(s) completed{extra}"


def place_sha(place: Place) -> str | None:
    data = place.read(limit=MAX_READ_BYTES)
    return None if data is None else sha256_bytes(data)


def read_journal(store: StateStore, journal) -> tuple[list[tuple[Place, dict]], list[Place]]:
    """The journal's files as validated (path, entry) pairs and its prune folders; StateCorruptError (nothing
    written) when any field is missing, mistyped, or names a place outside what the run could touch."""
    where = f"journal {store.journal_file}"

    def need(condition, message):
        if not condition:
            raise StateCorruptError(f"{where}: {message}",
                                    hint="inspect it by hand; the bytes it names are in journal-data/")

    need(isinstance(journal, dict), "not a JSON object")
    check_format(where, journal, (1, JOURNAL_FORMAT), hint="inspect it by hand; the bytes it names are in journal-data/")
    need(isinstance(journal.get("files"), list), "'files' is missing or not a list")
    need("state_after" in journal, "'state_after' is missing")
    need("manifest_after" not in journal or journal["manifest_after"] is None
         or isinstance(journal["manifest_after"], dict), "'manifest_after' is not an object")
    State.from_json(journal["state_after"], store.confinement, what=f"{where}: its state_after")
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


def is_blob_name(name) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name \
        and name not in (".", "..") and "\x00" not in name


def read_blob(store: StateStore, name: str) -> bytes | None:
    """A blob of journal-data/, read only when it is a regular file reached without a link (None otherwise)."""
    try:
        return store.read(data_dir(store) / name, limit=MAX_READ_BYTES)
    except (OSError, IOFailure):     # gone, special, far larger than any file a run writes: damaged
        return None


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
    if os.path.lexists(store.journal_file) or os.path.lexists(data_dir(store)):
        return True
    return bool(temp_files(store))


def recover_if_pending(store: StateStore) -> str | None:
    """For read-only commands (status, list, verify, overlay list): finish an interrupted run first, under the
    target's lock, and only when there is one (a read of a target nobody is changing takes no lock)."""
    store.check_folder()
    if not needs_recovery(store):
        return None
    with target_lock(store, reader=True):
        return recover(store)

