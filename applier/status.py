"""Status and drift of every catalog patch on a target: applied, not applied, lost, modified, ...; and where the
overlay pack's node is installed, by applier or the ComfyUI way (ComfyUI-Manager, `comfy node install`, git)."""
from __future__ import annotations

from dataclasses import dataclass, field

from applier import diffengine
from applier.catalog import Patch
from applier.catalog.allowlist import confinement_for
from applier.catalog.packmeta import read_pack
from applier.catalog.planner import (PlanAction, load_file_patches, not_applicable_reason, plan_patch, reapply_plan,
                             stale_advice)
from applier.diffengine import FileState, HunkState
from applier.errors import ApplierError, NoVariantError
from applier.pack.node_pack import Installer, find_copies
from applier.pack.overlays import manifest_pack
from applier.store.confine import Confinement
from applier.store.fsutil import MAX_READ_BYTES, sha256_bytes
from applier.store.record import pristine_hashes
from applier.store.applied import AppliedPatch, State
from applier.strenum import StrEnum, assert_never
from applier.target import Target


class PatchState(StrEnum):
    """A patch's status on a target (a file's: APPLIED, LOST or MODIFIED), as the JSON "state" says it."""
    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    LOST = "lost"                   # drift: an update or a reinstall replaced a patched file
    MODIFIED = "modified"           # drift: a patched file was edited since apply
    PARTIAL = "partial"
    CONFLICT = "conflict"
    NOT_APPLICABLE = "not-applicable"


STATES = tuple(PatchState)
DRIFT = (PatchState.LOST, PatchState.MODIFIED)


@dataclass
class FileStatus:
    path: str
    state: PatchState
    note: str = ""


@dataclass
class PatchStatus:
    id: str
    state: PatchState
    variant: str | None
    reason: str
    recorded: bool = False
    files: list[FileStatus] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"id": self.id, "state": self.state, "variant": self.variant, "reason": self.reason,
                "recorded": self.recorded,
                "files": [{"path": f.path, "state": f.state, "note": f.note} for f in self.files]}


def needs_second_look(statuses: list[PatchStatus]) -> bool:
    """Readings a concurrent apply or revert can produce mid-run: drift, a patch in the files but not recorded, a
    patch half in place. A lockless reader confirms them under the lock before reporting them."""
    return any(s.state in DRIFT or s.state is PatchState.PARTIAL or (s.state is PatchState.APPLIED and not s.recorded)
               for s in statuses)


def compute_status(target: Target, catalog: list[Patch], state: State,
                   only: tuple[str, ...] = (), confinement: Confinement | None = None) -> list[PatchStatus]:
    """The status of every catalog patch and every recorded one (or of those `only` names: ids or components).
    `confinement`: the one the state was loaded with (built from the catalog when not given)."""
    by_id = {p.id: p for p in catalog}
    if confinement is None:
        confinement = confinement_for(target, catalog)
    pristine = pristine_hashes(target.site_packages)
    wanted = (lambda pid: not only or pid in only or pid.split("/")[0] in only)  # noqa: E731
    out = []
    for patch in catalog:
        if not wanted(patch.id):
            continue
        record = state.applied.get(patch.id)
        if record is not None:
            out.append(recorded_status(target, confinement, record, patch, state, pristine))
        else:
            out.append(unrecorded_status(target, patch))
    for patch_id, record in state.applied.items():  # recorded, but gone from the catalog
        if patch_id not in by_id and wanted(patch_id):
            out.append(recorded_status(target, confinement, record, None, state, pristine))
    return out


def recorded_status(target: Target, confinement: Confinement, record: AppliedPatch, patch: Patch | None,
                    state: State, pristine: dict[str, str]) -> PatchStatus:
    files = [file_status(confinement, record, f, patch, state, pristine) for f in record.files]
    states = {f.state for f in files}
    if PatchState.LOST in states:
        overall = PatchState.LOST
        reason = stale_reason(target, record, patch) or \
            "an update or a reinstall replaced a patched file: `applier apply` re-applies it"
    elif PatchState.MODIFIED in states:
        overall = PatchState.MODIFIED
        reason = stale_reason(target, record, patch) or "a patched file was edited since apply"
    else:
        overall = PatchState.APPLIED
        reason = f"applied {record.applied_at} on {record.component} {record.component_version}"
    return PatchStatus(record.id, overall, record.variant, reason, recorded=True, files=files)


def stale_reason(target: Target, record: AppliedPatch, patch: Patch | None) -> str | None:
    """For a drifted patch that no variant of the catalog can apply again: the advice `apply` gives too (the
    command that clears the record). None when `apply` can re-apply it, or the drift is a hand edit."""
    if patch is None:
        return stale_advice(target, record.id, "it is not in this catalog any more")
    if not_applicable_reason(target, patch):
        return None
    try:
        reapply_plan(target, patch)
    except NoVariantError as exc:
        return stale_advice(target, record.id, exc.message.splitlines()[0])
    except ApplierError:
        return None
    return None


def file_status(confinement: Confinement, record: AppliedPatch, f, patch: Patch | None, state: State,
                pristine: dict[str, str]) -> FileStatus:
    path = confinement.resolve(record.root, f.relpath)
    shown = str(path)
    current = path.read(limit=MAX_READ_BYTES)
    current_sha = None if current is None else sha256_bytes(current)
    if current_sha == f.sha256_after:
        return FileStatus(shown, PatchState.APPLIED)
    if current_sha == f.sha256_before:
        return FileStatus(shown, PatchState.LOST, "back to its original bytes")
    if f.relpath in pristine and current_sha == pristine[f.relpath] and record.component == "torch":
        return FileStatus(shown, PatchState.LOST, "matches torch's RECORD: reinstalled or upgraded")
    if current is None:
        return FileStatus(shown, PatchState.LOST, "the file is gone")
    found = classify_recorded(record, f, current, patch)
    match found:
        case FileState.APPLIED:
            writer = state.last_writer(record.component, f.relpath)
            if writer is not None and writer.id != record.id and any(
                    w.relpath == f.relpath and w.sha256_after == current_sha for w in writer.files):
                return FileStatus(shown, PatchState.APPLIED, f"{writer.id} was applied on top")
            return FileStatus(shown, PatchState.MODIFIED, "the patch is in place, but the file was edited since")
        case FileState.NOT_APPLIED:
            return FileStatus(shown, PatchState.LOST, "the file was replaced by a version without the patch")
        case FileState.PARTIAL | FileState.CONFLICT | None:
            return FileStatus(shown, PatchState.MODIFIED, "edited since apply; the patched region is not intact")
        case _:
            assert_never(found)


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
        return PatchStatus(patch.id, PatchState.CONFLICT, None, exc.message.splitlines()[0])
    variant = plan.variant.name if plan.variant else None
    match plan.action:
        case PlanAction.NOT_APPLICABLE:
            return PatchStatus(patch.id, PatchState.NOT_APPLICABLE, variant, plan.reason)
        case PlanAction.ALREADY_APPLIED:
            return PatchStatus(patch.id, PatchState.APPLIED, variant,
                               "found in the files but not recorded (applied by hand or another tool)")
        case PlanAction.APPLY:
            if any(h.state is HunkState.APPLIED for c in plan.files for h in c.plan.hunks):
                return PatchStatus(patch.id, PatchState.PARTIAL, variant, "some hunks are in place, others are not")
            return PatchStatus(patch.id, PatchState.NOT_APPLIED, variant, plan.reason)
        case _:
            assert_never(plan.action)


def installed_by_words(installer: Installer) -> str:
    match installer:
        case Installer.APPLIER:
            return "installed by `applier overlay install` (its manifest lists the files)"
        case Installer.GIT:
            return "installed from a git URL (ComfyUI-Manager or git clone), not by applier"
        case Installer.REGISTRY:
            return "installed from the Comfy Registry (ComfyUI-Manager or comfy node install), not by applier"
        case Installer.COPIED:
            return "copied in by hand, not by applier"
        case _:
            assert_never(installer)


def node_pack_installs(target: Target) -> list[dict]:
    """Each folder under the target's custom_nodes/ that holds the overlay pack's node (node_pack.find_copies),
    with who installed it: APPLIER for the folder its overlay manifest names, else what the folder shows (GIT,
    REGISTRY, COPIED); and whether its node finds the kernels package (its own copy, or site-packages')."""
    if target.comfyui_root is None:
        return []
    managed = manifest_pack(target.state_dir)
    package = read_pack()["package"]
    # the environment's own site-packages first, then torch's (a parent environment's, also on sys.path there)
    in_site = next((folder / package for folder in dict.fromkeys((target.purelib, target.site_packages))
                    if folder is not None and (folder / package / "__init__.py").is_file()), None)
    out = []
    for copy in find_copies(target.comfyui_root):
        by_applier = managed is not None and copy.folder.name == managed["node"]
        found = copy.folder / package if copy.carries_package else in_site
        out.append({**copy.to_json(), "installed_by": Installer.APPLIER if by_applier else copy.source,
                    "finds_package": found is not None, "package_at": str(found) if found is not None else None})
    return out


def parts_line(target: Target) -> str | None:
    """Where each part goes on this install, in one line: torch's patches where torch is, the overlay package in
    the environment's own site-packages (they differ in a venv made with --system-site-packages)."""
    if target.site_packages is None and target.purelib is None:
        return None
    if target.purelib == target.site_packages:
        return f"site-packages: {target.site_packages} (torch patches and the overlay package)"
    return (f"site-packages: torch patches in {target.site_packages or '-'} (where torch is); the overlay package in "
            f"{target.purelib or '-'} (this environment's own)")


def node_pack_lines(installs: list[dict]) -> list[str]:
    """The node pack's installs in words, one line each, and what to do about two loaded copies or a node that
    cannot find its kernels."""
    if not installs:
        return ["node pack: not installed (applier overlay install, or ComfyUI-Manager with the folder `applier "
                "overlay export` writes)"]
    lines = []
    for item in installs:
        notes = [f"version {item['version'] or 'unknown'}",
                 "this applier's pack" if item["same_as_this_applier"] else "other files than this applier's pack"]
        if item["disabled"]:
            notes.append("disabled: ComfyUI does not load it")
        elif not item["finds_package"]:
            notes.append("no fused_dit beside it nor in site-packages: the node fails when it runs")
        else:
            notes.append(f"its kernels package: {item['package_at']}")
        lines.append(f"node pack: {item['folder']}: {installed_by_words(Installer(item['installed_by']))}; {', '.join(notes)}")
    loaded = [item for item in installs if not item["disabled"]]
    if len(loaded) > 1:
        lines.append(f"node pack: ComfyUI loads {len(loaded)} copies of the same node (the last one loaded wins): "
                     "keep one (`applier overlay uninstall` removes applier's; remove or disable the others)")
    return lines
