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
import time
from dataclasses import dataclass
from pathlib import Path

from applier.confine import legacy_relative
from applier.errors import IOFailure, StateCorruptError
from applier.failpoints import failpoint
from applier.fsutil import (TEMP_SUFFIX, atomic_write, check_writable, io_failure, read_regular, remove_file,
                            remove_stale_bytecode, sha256_bytes, sha256_file, subfolders)
from applier.lock import target_lock
from applier.state import SHA256, State, StateStore, dump_json, read_json

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
            manifest_after=KEEP, prune: tuple[Path, ...] = ()) -> None:
    """Replace every file of ops, record new_state (and the overlay manifest, None to remove it), then remove the
    folders of `prune` that the run left empty; or change nothing. Caller holds the target lock."""
    confinement = store.confinement
    names = [confinement.relative(op.path) for op in ops]      # refuses any path no patch or overlay may touch
    prune_names = [confinement.relative_dir(folder) for folder in prune]
    for op in ops:
        check_writable(op.path)
    store.check_roots()
    payload_dir = data_dir(store)
    entries = []
    try:
        store.remove_tree(payload_dir)
        store.make_folder(payload_dir)
        for n, (op, (root, relpath)) in enumerate(zip(ops, names)):
            entry = {"root": root, "relpath": relpath, "old_sha256": op.old_sha, "new_sha256": op.new_sha,
                     "old_bytes": None, "new_bytes": None}
            for side, data in (("old", op.old), ("new", op.new)):
                if data is not None:
                    name = f"{n:04d}.{side}"
                    store.write(payload_dir / name, data, mode=0o600)
                    entry[f"{side}_bytes"] = name
            entries.append(entry)
        journal = {
            "format": JOURNAL_FORMAT,
            "what": description,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "how_to_read": "files listed here (relative to their root: the ComfyUI folder or site-packages) are "
                           "being replaced; the next applier command finishes the run: each file still at "
                           "old_sha256 gets the bytes in journal-data/<new_bytes>",
            "files": entries,
            "prune": [{"root": root, "relpath": rel} for root, rel in prune_names],
            "state_after": new_state.to_json(),
        }
        if manifest_after is not KEEP:
            journal["manifest_after"] = manifest_after
        failpoint("after-backups")
        store.check_roots()
        store.write(store.journal_file, dump_json(journal), mode=0o644)
    except OSError as exc:
        store.remove_tree(payload_dir)
        raise io_failure(exc, store.dir, "write the journal in") from exc
    failpoint("after-journal")

    done: list[FileOp] = []
    try:
        for op in ops:
            store.check_roots()   # a moved or deleted install: stop; its journal goes with it and finishes there
            write_target(op.path, op.new)
            done.append(op)
            if len(done) == 1:
                failpoint("after-first-file")
    except OSError as exc:
        rollback(done)
        clear(store)
        raise io_failure(exc, op.path, "replace") from exc
    failpoint("after-files")
    finish(store, journal, [confinement.resolve_dir(root, rel) for root, rel in prune_names])


def finish(store: StateStore, journal: dict, prune: list[Path]) -> None:
    """Record what a run leaves (manifest, state), remove the folders it emptied, then the journal."""
    try:
        if "manifest_after" in journal:
            write_manifest(store, journal["manifest_after"])
        store.save(State.from_json(journal["state_after"], store.confinement, what="the journal's state_after"))
    except OSError as exc:
        raise io_failure(exc, store.dir, "record the state in") from exc
    failpoint("after-state")
    for folder in prune:
        prune_empty(folder)
    clear(store)


def write_manifest(store: StateStore, data: dict | None) -> None:
    if data is None:
        store.remove(store.overlay_manifest)
    else:
        store.write(store.overlay_manifest, dump_json(data), mode=0o644)


def write_target(path: Path, data: bytes | None) -> None:
    """Give path its new bytes (None: remove it). A symlink stays a symlink: the file it points to (inside the
    target: planning and Confinement checked that) gets the bytes."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if data is None:
        remove_file(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    remove_stale_bytecode(path)


def rollback(done: list[FileOp]) -> None:
    for op in reversed(done):
        write_target(op.path, op.old)


def clear(store: StateStore) -> None:
    store.remove(store.journal_file)
    store.remove_tree(data_dir(store))


def prune_empty(top: Path) -> None:
    """Remove every folder at or below top that holds nothing (a __pycache__ holding only bytecode counts as
    nothing), deepest first; never a folder above top, never through a symlink."""
    for folder in sorted(subfolders(top), key=lambda p: len(p.parts), reverse=True):
        try:
            if folder.name == "__pycache__" and all(p.suffix == ".pyc" for p in folder.iterdir()):
                for p in folder.iterdir():
                    p.unlink()
            folder.rmdir()
        except OSError:
            continue


def pending(store: StateStore) -> dict | None:
    """The journal of an interrupted run, None when there is none."""
    store.check_folder()
    return read_json(store.journal_file)


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
    for path, entry in entries:
        current = sha256_file(path)
        if current == entry["new_sha256"]:
            continue
        if current != entry["old_sha256"]:
            raise StateCorruptError(
                f"interrupted run: {path} holds neither its old nor its new bytes (sha256 {current})",
                hint=f"someone changed it meanwhile; compare with {data_dir(store)} and fix by hand, "
                     f"then remove {store.journal_file}")
        new = None
        if entry["new_bytes"] is not None:
            new = read_blob(store, entry["new_bytes"])
            if new is None or sha256_bytes(new) != entry["new_sha256"]:
                raise StateCorruptError(f"journal data for {path} is missing or damaged",
                                        hint=f"see {store.journal_file}")
        try:
            write_target(path, new)
        except OSError as exc:
            raise io_failure(exc, path, "finish the interrupted run on") from exc
        finished += 1
    finish(store, journal, prune)
    swept = sweep_temp_files(store)
    extra = f", {swept} temp file(s) removed" if swept else ""
    return f"finished an interrupted run ({journal.get('what', '?')}): {finished} file(s) completed{extra}"


def read_journal(store: StateStore, journal) -> tuple[list[tuple[Path, dict]], list[Path]]:
    """The journal's files as validated (path, entry) pairs and its prune folders; StateCorruptError (nothing
    written) when any field is missing, mistyped, or names a place outside what the run could touch."""
    where = f"journal {store.journal_file}"

    def need(condition, message):
        if not condition:
            raise StateCorruptError(f"{where}: {message}",
                                    hint="inspect it by hand; the bytes it names are in journal-data/")

    need(isinstance(journal, dict), "not a JSON object")
    need(journal.get("format") in (1, JOURNAL_FORMAT), f"unknown format {journal.get('format')!r}")
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
    path = store.guard(data_dir(store) / name)
    try:
        return read_regular(path, follow_links=False)
    except (OSError, IOFailure):     # gone, special, far larger than any file a run writes: damaged
        return None


def sweep_temp_files(store: StateStore) -> int:
    """Remove `.<name>.<random>.applier-tmp` files a killed write left, in .applier/ and in every folder a catalog
    patch or the overlay pack writes to. Caller holds the target lock (a live run's temp file is never touched)."""
    folders = set(write_folders(store)) | set(subfolders(store.dir))
    removed = 0
    for folder in folders:
        try:
            candidates = [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX)]
        except OSError:
            continue
        for path in candidates:
            if path.is_file() and not path.is_symlink():
                remove_file(path)
                removed += 1
    return removed


def write_folders(store: StateStore) -> list[Path]:
    """Every folder a catalog patch writes into, and every folder below the overlay pack's install folders."""
    folders = set(store.confinement.catalog_folders())
    for top in store.confinement.overlay_tops():
        folders.update(subfolders(top))
    return sorted(folders)


def needs_recovery(store: StateStore) -> bool:
    """A journal is pending, or a killed write left a temp file: a read-only command must recover first."""
    if os.path.lexists(store.journal_file) or os.path.lexists(data_dir(store)):
        return True
    return any(has_temp_files(folder) for folder in [*subfolders(store.dir), *write_folders(store)])


def has_temp_files(folder: Path) -> bool:
    try:
        return any(p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX) for p in folder.iterdir())
    except OSError:
        return False


def recover_if_pending(store: StateStore) -> str | None:
    """For read-only commands (status, list, verify, overlay list): finish an interrupted run first, under the
    target's lock, and only when there is one (a read of a target nobody is changing takes no lock)."""
    store.check_folder()
    if not needs_recovery(store):
        return None
    with target_lock(store, reader=True):
        return recover(store)

