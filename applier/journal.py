"""The journal: the only code that changes target files. Crash-safe, all-or-nothing.

A run writes, in this order: the bytes every file will have and had (`journal-data/`), then `journal.json` (the
commit point: it says in words and data what is in flight, and the state to record at the end), then each target
file (temp file + fsync + os.replace), then `state.json`, then removes the journal. A process killed anywhere is
finished by the next command (`recover`): each file already at its new bytes is left, each still at its old bytes
is written. An error (disk full, permission) while files are being replaced rolls the written ones back at once.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from applier.errors import StateCorruptError
from applier.failpoints import failpoint
from applier.fsutil import (atomic_write, check_writable, io_failure, read_bytes_or_none, remove_file,
                            remove_stale_bytecode, sha256_bytes, sha256_file)
from applier.state import State, StateStore, dump_json, read_json

JOURNAL_FORMAT = 1


@dataclass
class FileOp:
    path: Path
    old: bytes | None          # None: the file does not exist before
    new: bytes | None          # None: the file is deleted
    like: Path | None = None   # take the mode (and owner) from this file when creating

    @property
    def old_sha(self) -> str | None:
        return None if self.old is None else sha256_bytes(self.old)

    @property
    def new_sha(self) -> str | None:
        return None if self.new is None else sha256_bytes(self.new)


def data_dir(store: StateStore) -> Path:
    return store.dir / "journal-data"


def execute(store: StateStore, ops: list[FileOp], new_state: State, description: str) -> None:
    """Replace every file of ops and record new_state, or change nothing. Caller holds the target lock."""
    for op in ops:
        check_writable(op.path)
    payload_dir = data_dir(store)
    entries = []
    try:
        shutil.rmtree(payload_dir, ignore_errors=True)
        payload_dir.mkdir(parents=True)
        for n, op in enumerate(ops):
            entry = {"path": str(op.path), "old_sha256": op.old_sha, "new_sha256": op.new_sha,
                     "old_bytes": None, "new_bytes": None, "like": str(op.like) if op.like else None}
            for side, data in (("old", op.old), ("new", op.new)):
                if data is not None:
                    name = f"{n:04d}.{side}"
                    atomic_write(payload_dir / name, data, mode=0o600)
                    entry[f"{side}_bytes"] = name
            entries.append(entry)
        journal = {
            "format": JOURNAL_FORMAT,
            "what": description,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "how_to_read": "files listed here are being replaced; the next applier command finishes the run: "
                           "each file still at old_sha256 gets the bytes in journal-data/<new_bytes>",
            "files": entries,
            "state_after": new_state.to_json(),
        }
        failpoint("after-backups")
        atomic_write(store.journal_file, dump_json(journal), mode=0o644)
    except OSError as exc:
        shutil.rmtree(payload_dir, ignore_errors=True)
        raise io_failure(exc, store.dir, "write the journal in") from exc
    failpoint("after-journal")

    done: list[FileOp] = []
    try:
        for op in ops:
            write_target(op.path, op.new, like=op.like)
            done.append(op)
            if len(done) == 1:
                failpoint("after-first-file")
    except OSError as exc:
        rollback(done)
        clear(store)
        raise io_failure(exc, op.path, "replace") from exc
    failpoint("after-files")
    store.save(new_state)
    failpoint("after-state")
    clear(store)


def write_target(path: Path, data: bytes | None, *, like: Path | None = None) -> None:
    if data is None:
        remove_file(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, like=like if (like is not None and not path.exists()) else None)
    remove_stale_bytecode(path)


def rollback(done: list[FileOp]) -> None:
    for op in reversed(done):
        write_target(op.path, op.old)


def clear(store: StateStore) -> None:
    remove_file(store.journal_file)
    shutil.rmtree(data_dir(store), ignore_errors=True)


def pending(store: StateStore) -> dict | None:
    """The journal of an interrupted run, None when there is none."""
    return read_json(store.journal_file)


def recover(store: StateStore) -> str | None:
    """Finish an interrupted run from its journal. Returns what was done, in words, or None when nothing was
    pending. Caller holds the target lock."""
    journal = pending(store)
    if journal is None:
        if data_dir(store).exists():  # killed before the commit point: no target file was touched
            shutil.rmtree(data_dir(store), ignore_errors=True)
        return None
    try:
        entries = journal["files"]
        state_after = journal["state_after"]
    except (KeyError, TypeError) as exc:
        raise StateCorruptError(f"journal {store.journal_file} is unreadable ({exc})",
                                hint="inspect it by hand; the bytes it names are in journal-data/") from exc
    finished = 0
    for entry in entries:
        path = Path(entry["path"])
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
            new = read_bytes_or_none(data_dir(store) / entry["new_bytes"])
            if new is None or sha256_bytes(new) != entry["new_sha256"]:
                raise StateCorruptError(f"journal data for {path} is missing or damaged",
                                        hint=f"see {store.journal_file}")
        like = Path(entry["like"]) if entry.get("like") else None
        try:
            write_target(path, new, like=like)
        except OSError as exc:
            raise io_failure(exc, path, "finish the interrupted run on") from exc
        finished += 1
    try:
        from applier.state import AppliedPatch  # local: avoid a cycle at import time
        state = State({k: AppliedPatch.from_json(v) for k, v in state_after["applied"].items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise StateCorruptError(f"journal {store.journal_file}: its state_after is unreadable ({exc})") from exc
    store.save(state)
    clear(store)
    return f"finished an interrupted run ({journal.get('what', '?')}): {finished} file(s) completed"


def recover_if_pending(store: StateStore) -> str | None:
    """For read-only commands (status, list, verify): finish an interrupted run first, under the target's lock,
    and only when there is one (a read of a target nobody is changing takes no lock)."""
    if not store.journal_file.exists():
        return None
    from applier.lock import target_lock  # local: lock is a shell concern, journal stays importable alone
    with target_lock(store.dir):
        return recover(store)
