"""Status and drift of every catalog patch on a target: applied, not applied, lost, modified, ..."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from applier import diffengine
from applier.catalog import Patch
from applier.diffengine import FileState
from applier.errors import ApplierError
from applier.fsutil import read_bytes_or_none, sha256_bytes
from applier.planner import load_file_patches, plan_patch
from applier.record import pristine_hashes
from applier.state import AppliedPatch, State
from applier.target import Target

STATES = ("applied", "not-applied", "lost", "modified", "partial", "conflict", "not-applicable")
DRIFT = ("lost", "modified")


@dataclass
class FileStatus:
    path: str
    state: str
    note: str = ""


@dataclass
class PatchStatus:
    id: str
    state: str                      # one of STATES
    variant: str | None
    reason: str
    recorded: bool = False
    files: list[FileStatus] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"id": self.id, "state": self.state, "variant": self.variant, "reason": self.reason,
                "recorded": self.recorded,
                "files": [{"path": f.path, "state": f.state, "note": f.note} for f in self.files]}


def compute_status(target: Target, catalog: list[Patch], state: State) -> list[PatchStatus]:
    by_id = {p.id: p for p in catalog}
    pristine = pristine_hashes(target.site_packages)
    out = []
    for patch in catalog:
        record = state.applied.get(patch.id)
        if record is not None:
            out.append(recorded_status(record, patch, state, pristine))
        else:
            out.append(unrecorded_status(target, patch))
    for patch_id, record in state.applied.items():  # recorded, but gone from the catalog
        if patch_id not in by_id:
            out.append(recorded_status(record, None, state, pristine))
    return out


def recorded_status(record: AppliedPatch, patch: Patch | None, state: State,
                    pristine: dict[str, str]) -> PatchStatus:
    files = [file_status(record, f, patch, state, pristine) for f in record.files]
    states = {f.state for f in files}
    if "lost" in states:
        overall, reason = "lost", "an update or a reinstall replaced a patched file: `applier apply` re-applies it"
    elif "modified" in states:
        overall, reason = "modified", "a patched file was edited since apply"
    else:
        overall, reason = "applied", f"applied {record.applied_at} on {record.component} {record.component_version}"
    return PatchStatus(record.id, overall, record.variant, reason, recorded=True, files=files)


def file_status(record: AppliedPatch, f, patch: Patch | None, state: State, pristine: dict[str, str]) -> FileStatus:
    current = read_bytes_or_none(Path(f.path))
    current_sha = None if current is None else sha256_bytes(current)
    if current_sha == f.sha256_after:
        return FileStatus(f.path, "applied")
    if current_sha == f.sha256_before:
        return FileStatus(f.path, "lost", "back to its original bytes")
    if f.relpath in pristine and current_sha == pristine[f.relpath] and record.component == "torch":
        return FileStatus(f.path, "lost", "matches torch's RECORD: reinstalled or upgraded")
    found = classify_recorded(record, f, current, patch)
    if found == FileState.APPLIED:
        writer = state.last_writer(f.path)
        if writer is not None and writer.id != record.id and any(
                w.path == f.path and w.sha256_after == current_sha for w in writer.files):
            return FileStatus(f.path, "applied", f"{writer.id} was applied on top")
        return FileStatus(f.path, "modified", "the patch is in place, but the file was edited since")
    if found == FileState.NOT_APPLIED:
        return FileStatus(f.path, "lost", "the file was replaced by a version without the patch")
    if current is None:
        return FileStatus(f.path, "lost", "the file is gone")
    return FileStatus(f.path, "modified", "edited since apply; the patched region is not intact")


def classify_recorded(record: AppliedPatch, f, current: bytes | None, patch: Patch | None) -> FileState | None:
    if patch is None:
        return None
    try:
        fps = [fp for fp in load_file_patches(patch, patch.variant(record.variant)) if fp.path == f.relpath]
    except ApplierError:
        return None
    return diffengine.classify_file(fps[0], current, fuzz=record.fuzz) if fps else None


def unrecorded_status(target: Target, patch: Patch) -> PatchStatus:
    try:
        plan = plan_patch(target, patch)
    except ApplierError as exc:
        return PatchStatus(patch.id, "conflict", None, exc.message.splitlines()[0])
    variant = plan.variant.name if plan.variant else None
    if plan.action == "not-applicable":
        return PatchStatus(patch.id, "not-applicable", variant, plan.reason)
    if plan.action == "already-applied":
        return PatchStatus(patch.id, "applied", variant,
                           "found in the files but not recorded (applied by hand or another tool)")
    partial = any(h.state.value == "applied" for c in plan.files for h in c.plan.hunks)
    if partial:
        return PatchStatus(patch.id, "partial", variant, "some hunks are in place, others are not")
    return PatchStatus(patch.id, "not-applied", variant, plan.reason)
