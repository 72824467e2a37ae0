"""What is applied: the values of the state document (`.applier/state.json`): every applied patch with its files
(relative to their component root) and their sha256 before and after, its variant and versions. Format 2,
validated on every read: every field typed, every file resolvable inside the target (confine.py). Pure values: the
state folder that holds them, and every read and write of it, is state.py's."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from applier import __version__
from applier.errors import StateCorruptError
from applier.store.confine import COMPONENT_ROOT, Confinement, check_relpath
from applier.store.heldroot import HeldRoot
from applier.store.statefolder import KEEP, Opened, RunEnds, StoreLayout

STATE_FORMAT = 2
JOURNAL_FORMAT = 2
JOURNAL_FORMATS = (1, JOURNAL_FORMAT)    # the journals this applier finishes (1: files named by absolute path)
READABLE_FORMATS = (1, 2)      # format 1 (applier 0.1) also kept an absolute "path" per file: it is ignored
PATCH_ID = re.compile(r"(comfyui|torch)/[A-Za-z0-9][A-Za-z0-9._-]*")
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass
class AppliedFile:
    relpath: str                    # relative to its component root, "/" separators
    sha256_before: str | None       # None: the patch created the file
    sha256_after: str | None        # None: the patch deleted the file
    backup: str | None = None       # relative to the state folder; None for created files
    mode: int | None = None
    accepted: bool = False          # sha256_after is a hand-edited file `applier accept` took as the patched state


@dataclass
class AppliedPatch:
    id: str
    variant: str
    component: str
    files: list[AppliedFile]
    component_version: str | None
    applied_at: str
    applier_version: str = ""
    seq: int = 0                    # application order: a later patch on the same file sits on top
    fuzz: int = 0                   # the fuzz it was applied with: status and revert must look with the same

    @property
    def root(self) -> str:
        return COMPONENT_ROOT[self.component]

    @classmethod
    def from_json(cls, patch_id, data) -> "AppliedPatch":
        """Strictly typed: a field of the wrong type is a StateCorruptError, never a crash later."""
        where = f"state entry {patch_id!r}"
        need(isinstance(data, dict), f"{where} is not an object")
        need(isinstance(patch_id, str) and PATCH_ID.fullmatch(patch_id), f"{where}: not a patch id")
        rec_id = field_of(data, "id", str, where)
        component = field_of(data, "component", str, where)
        need(rec_id == patch_id, f"{where}: its id says {rec_id!r}")
        need(component == patch_id.split("/")[0], f"{where}: component {component!r} does not match its id")
        files = field_of(data, "files", list, where)
        return cls(
            id=rec_id, variant=field_of(data, "variant", str, where), component=component,
            files=[applied_file(f, patch_id, component, where) for f in files],
            component_version=field_of(data, "component_version", (str, type(None)), where),
            applied_at=field_of(data, "applied_at", str, where),
            applier_version=field_of(data, "applier_version", str, where, default=""),
            seq=field_of(data, "seq", int, where, default=0),
            fuzz=field_of(data, "fuzz", int, where, default=0))


def applied_file(data, patch_id: str, component: str, where: str) -> AppliedFile:
    need(isinstance(data, dict), f"{where}: a file entry is not an object")
    relpath = check_relpath(field_of(data, "relpath", str, where), where)
    before = field_of(data, "sha256_before", (str, type(None)), where)
    after = field_of(data, "sha256_after", (str, type(None)), where)
    for digest in (before, after):
        need(digest is None or SHA256.fullmatch(digest), f"{where}: {relpath}: a sha256 is not 64 hex digits")
    backup = field_of(data, "backup", (str, type(None)), where, default=None)
    if backup is not None:
        # Never trusted as a path: it must be the one name this patch's backup of this file can have.
        need(backup == backup_name(patch_id, component, relpath), f"{where}: {relpath}: unexpected backup {backup!r}")
    mode = field_of(data, "mode", (int, type(None)), where, default=None)
    need(mode is None or 0 <= mode <= 0o7777, f"{where}: {relpath}: bad mode")
    accepted = field_of(data, "accepted", bool, where, default=False)
    return AppliedFile(relpath, before, after, backup, mode, accepted)


def backup_name(patch_id: str, component: str, relpath: str) -> str:
    # Keyed by patch id + component + relative path: torch alone has hundreds of __init__.py.
    return f"backups/{patch_id}/{component}/{relpath}"


def check_format(what: str, data: dict, readable: tuple[int, ...], hint: str) -> None:
    """StateCorruptError (exit 7) unless data's "format" is one this applier reads. A format past the newest it reads
    was written by a newer applier: the message says so, with the version that wrote it where the file records one
    (its applier_version beside the format) and the format alone where an older writer recorded none."""
    found = data.get("format")
    if type(found) is int and found in readable:        # type(): True == 1, but true is no format
        return
    if not (type(found) is int and found > max(readable)):
        raise StateCorruptError(f"{what} has an unknown format {found!r}", hint=hint)
    writer = data.get("applier_version")
    if isinstance(writer, str) and writer.isprintable() and 0 < len(writer) <= 40:
        who = f"applier {writer}, format {found}"
    else:
        who = f"format {found}"
    raise StateCorruptError(f"{what} was written by a newer applier ({who}); applier {__version__} reads formats "
                            f"up to {max(readable)}",
                            hint="run the applier that wrote it, or a newer one; nothing was changed")


def need(condition, message: str) -> None:
    if not condition:
        raise StateCorruptError(message, hint="inspect .applier/ by hand (plain JSON); nothing was changed")


MISSING = object()


def field_of(data: dict, key: str, types, where: str, default=MISSING):
    if key not in data:
        need(default is not MISSING, f"{where} lacks {key!r}")
        return default
    value = data[key]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
    need(ok, f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


@dataclass
class State:
    applied: dict[str, AppliedPatch] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": STATE_FORMAT, "applier_version": __version__,
                "applied": {k: asdict(v) for k, v in self.in_order()}}

    @classmethod
    def from_json(cls, data, confinement: Confinement, *, what: str = "state") -> "State":
        """A State from JSON, every field typed and every file resolvable inside the target (else exit 7)."""
        need(isinstance(data, dict), f"{what} is not a JSON object")
        check_format(what, data, READABLE_FORMATS, hint="inspect .applier/ by hand (plain JSON); nothing was changed")
        applied = field_of(data, "applied", dict, what)
        state = cls({k: AppliedPatch.from_json(k, v) for k, v in applied.items()})
        for record in state.applied.values():
            for f in record.files:
                confinement.resolve(record.root, f.relpath, what=f"{what} ({record.id})")
        return state

    def in_order(self) -> list[tuple[str, "AppliedPatch"]]:
        return sorted(self.applied.items(), key=lambda item: (item[1].seq, item[0]))

    def next_seq(self) -> int:
        return max((p.seq for p in self.applied.values()), default=0) + 1

    def adding(self, records: list["AppliedPatch"]) -> "State":
        """This state with records added on top, in their order (their seq numbered after every recorded one)."""
        applied = dict(self.applied)
        for seq, record in enumerate(records, start=self.next_seq()):
            applied[record.id] = replace(record, seq=seq)
        return State(applied)

    def last_writer(self, component: str, relpath: str) -> "AppliedPatch | None":
        """The applied patch that wrote the file last (its sha256_after is what the file should hold)."""
        writers = [p for _, p in self.in_order()
                   if p.component == component and any(f.relpath == relpath for f in p.files)]
        return writers[-1] if writers else None


@dataclass
class Pending:
    """The state folder as a command that changes the install found it, read once under the lock (StateStore.open_run):
    the state it has (while an interrupted run's journal is there, that run's state_after: what finishing it records),
    and that run: its journal and what it records (statefolder.RunEnds)."""
    state: State
    folder: HeldRoot
    journal: dict | None = None
    ends: RunEnds | None = None


def pending_of(opened: Opened, layout: StoreLayout, confinement: Confinement) -> Pending:
    """The documents open_store read, made values: the state, or an interrupted run's journal (a JSON object of a
    format this applier reads, with a valid state_after: else StateCorruptError, nothing written; its other fields
    are journal.py's to check) and the state that run records."""
    journal_file, state_file = layout.shown / layout.journal_name, layout.shown / layout.state_name
    raw = opened.documents.get(layout.journal_name)
    journal = None if raw is None else parse_json(raw, journal_file)
    raw = opened.documents.get(layout.state_name) if journal is None else None
    data, what = (None if raw is None else parse_json(raw, state_file)), f"state file {state_file}"
    if journal is not None:
        where = f"journal {journal_file}"
        hint = "inspect it by hand; the bytes it names are in journal-data/"
        if not isinstance(journal, dict):
            raise StateCorruptError(f"{where}: not a JSON object", hint=hint)
        check_format(where, journal, JOURNAL_FORMATS, hint=hint)
        if "state_after" not in journal:
            raise StateCorruptError(f"{where}: 'state_after' is missing", hint=hint)
        data, what = journal["state_after"], f"{where}: its state_after"
    state = State.from_json(data, confinement, what=what) if data is not None else State()
    if journal is None:
        return Pending(state, opened.folder)
    ends = RunEnds(opened.folder, layout, dict(opened.roots), state.to_json(), journal.get("manifest_after", KEEP))
    return Pending(state, opened.folder, journal, ends)


def parse_json(raw: bytes, path: Path):
    """A document's bytes as JSON (StateCorruptError, exit 7, when they are not)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateCorruptError(
            f"{path} is not valid JSON ({exc})",
            hint=f"inspect or move it aside by hand; original bytes stay in {path.parent / 'backups'}") from exc
    except RecursionError as exc:
        raise StateCorruptError(f"{path} is nested too deeply to be a file applier wrote",
                                hint="inspect or move it aside by hand; nothing was changed") from exc
