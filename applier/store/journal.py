"""The journal: what a run holds, decided before anything is written; and recovery of an interrupted run.

`plan` turns a run's file operations into a writer.Run: every file as a Place inside the install, the backups, and
`journal.json` (the commit point: it says in words and data what is in flight, and the state and overlay manifest
to record at the end) with the bytes every file will have and had (`journal-data/`). writer.carry_out writes it,
in that order, all or nothing. A process killed anywhere is finished by the next command (`recover`): each file
already at its new bytes is left, each still at its old bytes is written (the rest of the run, planned here and
carried out by the same writer), and the temp files a killed write left behind are removed.

Files are named by (root, relative path), never by an absolute path, and every name read back is resolved through
the target's Confinement: a crafted journal cannot make recovery write outside the target.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from applier import __version__
from applier.errors import StateCorruptError
from applier.store.applied import JOURNAL_FORMAT, SHA256, Pending
from applier.store.confine import Confinement, Place, legacy_relative, missing_folders
from applier.store.fsutil import MAX_WALK_DEPTH, MAX_WALK_ENTRIES, check_writable, dump_json, sha256_bytes
from applier.store.state import StateStore, private_mode
from applier.store.statefolder import KEEP, RunEnds, read_blob
from applier.store.writer import Run, Write, carry_out, sweep_temp_files, temp_files


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
    name: str                  # relative to the state folder (applied.backup_name)
    data: bytes
    original: os.stat_result | None   # the file's stat (None: unknown): the backup is no more readable than it


def plan(ends: RunEnds, confinement: Confinement, ops: list[FileOp], description: str, *, prune: tuple = (),
         backups: list[Backup] = ()) -> Run:
    """The whole run as data (writer.Run), nothing written: every file of ops as a Place (each path checked once,
    here, against what the install may touch; from then on every write goes through its root's held handle, so a
    link swapped in after this check is refused at the write and the run rolled back), the folders it creates and
    may empty, the backups, and journal.json with the bytes every file will have and had (journal-data/)."""
    places = [confinement.relative(op.path) for op in ops]    # refuses any path no patch or overlay may touch
    prune_places = [confinement.relative_dir(folder) for folder in prune]
    fresh = missing_folders(places)
    for place in places:
        check_writable(place.path)
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
        "state_after": ends.state_after,
    }
    if ends.manifest_after is not KEEP:
        journal["manifest_after"] = ends.manifest_after
    # no more readable than the original: a private nodes.py gets a private backup
    return Run(ends, [Write(place, op.old, op.new) for op, place in zip(ops, places)], journal=dump_json(journal),
               backups=[(b.name, b.data, private_mode(b.original)) for b in backups], blobs=blobs, fresh=fresh,
               prune=prune_places)


def recover(store: StateStore) -> str | None:
    """Finish an interrupted run from its journal and remove the temp files killed writes left (finish). Returns
    what was done, in words, or None when nothing was pending. Caller holds the target lock."""
    return finish(store.confinement, store.read_pending())


def finish(confinement: Confinement, pending: Pending) -> str | None:
    """Finish what the state folder held when the command opened it (Pending): the interrupted run's remaining files
    written (planned here, carried out by the one writer) and the temp files removed. Returns what was done, in
    words, or None when nothing was pending."""
    run = interrupted(confinement, pending)
    written = carry_out(run)
    swept = sweep_temp_files(run.sweep)
    if pending.journal is None:
        return f"removed {swept} temp file(s) left by an interrupted run" if swept else None
    extra = f", {swept} temp file(s) removed" if swept else ""
    return f"finished an interrupted run ({pending.journal.get('what', '?')}): {written} file(s) completed{extra}"


def interrupted(confinement: Confinement, pending: Pending) -> Run:
    """The rest of an interrupted run, committed already, as data: each file of the journal with the sha256 it had
    and will have, only those still at their old bytes, with their new bytes from journal-data/ (still_to_write:
    every file checked first, reading only their blobs), then the run finishes; and, whether a run was pending or
    not, where temp files are swept."""
    journal = pending.journal
    entries, prune = ([], []) if journal is None else read_journal(
        confinement, journal, pending.ends.layout.shown / pending.ends.layout.journal_name)
    sweep = confinement.sweep(pending.folder, max_depth=MAX_WALK_DEPTH, max_entries=MAX_WALK_ENTRIES)
    if journal is None:
        return Run(None, [], sweep=sweep)
    files = still_to_write(pending.ends, [Write(place, None, None, expect=(entry["old_sha256"], entry["new_sha256"]),
                                                blob=entry["new_bytes"]) for place, entry in entries])
    return Run(pending.ends, files, prune=prune, sweep=sweep)


def still_to_write(ends: RunEnds, writes: list[Write]) -> list[Write]:
    """The files of a committed run (writes, each with its expect and blob) that still hold their old bytes, their
    new bytes read from journal-data/; every file is checked (and its new bytes against the journal's sha256) before
    the writer writes the first: StateCorruptError, nothing written, for one that holds neither its old nor its new
    bytes, or whose new bytes are missing or damaged."""
    data = ends.layout.shown / ends.layout.data_name
    files = []
    for write in writes:
        old_sha, new_sha = write.expect
        current = write.place.sha256()
        if current == new_sha:
            continue
        if current != old_sha:
            raise StateCorruptError(
                f"interrupted run: {write.place} holds neither its old nor its new bytes (sha256 {current})",
                hint=f"someone changed it meanwhile; compare with {data} and fix by hand, "
                     f"then remove {ends.layout.shown / ends.layout.journal_name}")
        new = write.new if write.blob is None else read_blob(ends, write.blob)
        if (None if new is None else sha256_bytes(new)) != new_sha:
            raise StateCorruptError(f"journal data for {write.place} is missing or damaged",
                                    hint=f"see {ends.layout.shown / ends.layout.journal_name}")
        files.append(replace(write, new=new))
    return files


def read_journal(confinement: Confinement, journal, path: Path) -> tuple[list[tuple[Place, dict]], list[Place]]:
    """The journal's files as validated (path, entry) pairs and its prune folders; StateCorruptError (nothing
    written) when any field is missing, mistyped, or names a place outside what the run could touch."""
    where = f"journal {path}"

    def need(condition, message):
        if not condition:
            raise StateCorruptError(f"{where}: {message}",
                                    hint="inspect it by hand; the bytes it names are in journal-data/")

    # read_run checked that it is an object of a format this applier reads, with a valid state_after
    need(isinstance(journal.get("files"), list), "'files' is missing or not a list")
    need("manifest_after" not in journal or journal["manifest_after"] is None
         or isinstance(journal["manifest_after"], dict), "'manifest_after' is not an object")
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


def needs_recovery(store: StateStore) -> bool:
    """A journal is pending, or a killed write left a temp file: a read-only command must recover first."""
    if os.path.lexists(store.journal_file) or os.path.lexists(store.run_data):
        return True
    return bool(temp_files(store.confinement.sweep(store.held(), max_depth=MAX_WALK_DEPTH,
                                                   max_entries=MAX_WALK_ENTRIES)))


def recover_if_pending(store: StateStore) -> str | None:
    """For read-only commands (status, list, verify, overlay list): finish an interrupted run first, under the
    target's lock, and only when there is one (a read of a target nobody is changing takes no lock)."""
    store.check_folder()
    if not needs_recovery(store):
        return None
    with store.locked(reader=True):
        return recover(store)

