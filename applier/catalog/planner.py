"""Planning: which variant of each patch fits the target, and what every file would become. Reads, never writes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from applier import diffengine
from applier.catalog.patch import FORMAT_DOC, Patch, Variant
from applier.diffengine import FilePatch, FilePlan, HunkState
from applier.errors import ApplierError, HunkConflict, NoVariantError, RefusedError, UnsafePathError
from applier.store.fsutil import read_inside_or_none
from applier.store.paths import resolve_inside
from applier.strenum import StrEnum
from applier.target import Target


@dataclass
class FileChange:
    relpath: str
    path: Path
    plan: FilePlan


class PlanAction(StrEnum):
    """What apply does with a patch (the "action" of its JSON report)."""
    APPLY = "apply"
    ALREADY_APPLIED = "already-applied"
    NOT_APPLICABLE = "not-applicable"


@dataclass
class PatchPlan:
    patch: Patch
    action: PlanAction
    reason: str
    variant: Variant | None = None
    component_version: str | None = None
    files: list[FileChange] = field(default_factory=list)

    @property
    def changes(self) -> list[FileChange]:
        return [f for f in self.files if f.plan.changed]

    def to_json(self) -> dict:
        return {
            "id": self.patch.id,
            "action": self.action,
            "reason": self.reason,
            "variant": self.variant.name if self.variant else None,
            "component_version": self.component_version,
            "files": [
                {"path": str(f.path), "relpath": f.relpath, "changed": f.plan.changed,
                 "hunks": [{"index": h.index, "state": h.state.value, "line": h.line, "offset": h.offset,
                            "fuzz": h.fuzz, "note": h.note} for h in f.plan.hunks]}
                for f in self.files
            ],
        }


def not_applicable_reason(target: Target, patch: Patch) -> str | None:
    root = target.component_root(patch.component)
    if patch.component == "comfyui" and root is None:
        return "no ComfyUI found in the target"
    if patch.component == "torch":
        if target.python is None and target.site_packages is None:
            return "no Python environment found for the target (use --python PATH)"
        if root is None:
            if target.site_packages_problem:
                return f"{target.site_packages_problem}: applier does not follow it (`applier detect` says more)"
            return "the target's site-packages could not be determined"
        if target.torch_version is None:
            return f"torch is not installed in {root}"
    return None


STATE_FOLDER = ".applier"


def load_file_patches(patch: Patch, variant: Variant) -> list[FilePatch]:
    """The file patches of one variant: the patch's shared diffs, then the variant's own.

    The one entry point for apply, revert, status and `catalog check`. Refused here, before any file is read: a diff
    that does not parse, two sections for one file (a shared diff and a variant's diff touching the same path), and
    any path with a `.applier` component (the catalog is data and never writes the tool's own state)."""
    try:
        file_patches = diffengine.parse_patch(variant.read_diff())
    except OSError as exc:
        raise RefusedError(f"{patch.id} variant {variant.name}: cannot read its diff: {exc}") from exc
    except ApplierError as exc:
        raise RefusedError(f"{patch.id} variant {variant.name}: {exc.message}") from exc
    seen = set()
    for fp in file_patches:
        parts = PurePosixPath(fp.path.replace("\\", "/")).parts
        if any(part.lower() == STATE_FOLDER for part in parts):
            raise UnsafePathError(f"{patch.id} variant {variant.name}: the diff names {fp.path}, inside applier's "
                                  f"own {STATE_FOLDER}/ folder - refused")
        if fp.path in seen:
            raise RefusedError(f"{patch.id} variant {variant.name}: two sections change {fp.path}",
                               hint="a shared diff and the variant's diff must not touch the same file")
        seen.add(fp.path)
    return file_patches


Pending = dict  # {Path: bytes | None}: what earlier patches of the same run will have written

NEWER_CATALOG_HINT = ("this release is newer than the catalog: a newer applier (or a maintainer's "
                      "`applier catalog refresh`) carries the variant for it")


def read_planned(root: Path, path: Path, pending: Pending | None) -> bytes | None:
    """What the file will hold when the run gets to it: what an earlier patch of the run writes, else its bytes now,
    walked from root without a link leading out (fsutil.read_inside)."""
    if pending is not None and path in pending:
        return pending[path]
    return read_inside_or_none(root, path)


def plan_variant(target: Target, patch: Patch, variant: Variant, *, fuzz: int = 0,
                 pending: Pending | None = None) -> list[FileChange]:
    """Plan every file of one variant; HunkConflict when a hunk does not fit."""
    root = target.component_root(patch.component)
    changes = []
    for fp in load_file_patches(patch, variant):
        path = resolve_inside(root, fp.path, patch_id=patch.id)
        original = read_planned(root, path, pending)
        changes.append(FileChange(fp.path, path, diffengine.plan_file(fp, original, fuzz=fuzz)))
    return changes


def choose_variant(target: Target, patch: Patch, *, fuzz: int = 0,
                   pending: Pending | None = None) -> tuple[Variant, list[FileChange], str]:
    """(variant, its file plans, how it was chosen).

    By version when known; a version no variant claims is refused, unless it is newer than every variant's range (a
    release past the catalog): then, as for an unknown version, the one clean dry run decides and the reason says
    that its range did not include the version. When the version is unknown, or the variant
    that claims it does not fit the file (a release whose text changed between two version bumps, as ComfyUI's
    v0.3.44 and v0.3.47 tags), the one variant whose dry run is clean is taken and the reason says so; none or
    several clean is a refusal, never a guess."""
    version = target.component_version(patch.component)
    if version is None:
        return choose_by_dry_run(target, patch, fuzz, pending, f"{patch.component} version unknown")
    fitting = patch.variants_for(version)
    if len(fitting) > 1:
        raise NoVariantError(f"{patch.id}: several variants claim {patch.component} {version}: "
                             f"{', '.join(v.name for v in fitting)} (a catalog error)")
    if not fitting:
        claimed = "; ".join(f"{v.name}: {v.versions}" for v in patch.variants)
        if patch.is_past_some_variant(version):
            # A release newer than the catalog (or in a gap between two eras' ranges): its text often still
            # matches a known era, and a clean dry run is the same evidence selection uses for versionless trees.
            # Said so in the reason.
            where = "newer than every variant's range" if patch.is_past_every_variant(version) else \
                "between the variants' ranges"
            why = f"{patch.component} {version} is outside every variant's range"
            try:
                return choose_by_dry_run(target, patch, fuzz, pending, why)
            except NoVariantError as exc:
                raise NoVariantError(f"{patch.id} has no variant for {patch.component} {version}, which is {where} "
                                     f"({claimed}), and none applies cleanly",
                                     hint=f"{exc.hint}; {NEWER_CATALOG_HINT}" if exc.hint else NEWER_CATALOG_HINT
                                     ) from exc
        raise NoVariantError(f"{patch.id} has no variant for {patch.component} {version} (variants: {claimed})",
                             hint=f"a maintainer adds one with `applier catalog refresh` ({FORMAT_DOC})")
    variant = fitting[0]
    try:
        changes = plan_variant(target, patch, variant, fuzz=fuzz, pending=pending)
    except HunkConflict as conflict:
        others = [v for v in patch.variants if v is not variant]
        why = f"variant {variant.name}, which claims {patch.component} {version}, does not fit the file"
        try:
            return choose_by_dry_run(target, patch, fuzz, pending, why, others)
        except NoVariantError:
            raise HunkConflict(conflict.path, conflict.hunk_index, conflict.header, conflict.expected,
                               conflict.near_line, conflict.near_text,
                               f"{conflict.reason} ({patch.id} variant {variant.name} for {patch.component} "
                               f"{version}; was the file edited by hand?)") from conflict
    return variant, changes, f"{patch.component} {version} is in {variant.versions}"


def choose_by_dry_run(target: Target, patch: Patch, fuzz: int, pending: Pending | None, why: str,
                      variants: list[Variant] | None = None) -> tuple[Variant, list[FileChange], str]:
    clean, failures = [], []
    for variant in patch.variants if variants is None else variants:
        try:
            clean.append((variant, plan_variant(target, patch, variant, fuzz=fuzz, pending=pending)))
        except HunkConflict as exc:
            failures.append(f"{variant.name}: {exc.path} hunk #{exc.hunk_index}: {exc.reason.splitlines()[0]}")
    if len(clean) == 1:
        variant, changes = clean[0]
        if why.endswith("outside every variant's range"):
            return variant, changes, f"{why}; variant {variant.name} applies cleanly (dry run)"
        return variant, changes, f"{why}; only variant {variant.name} applies cleanly (dry run)"
    if not clean:
        raise NoVariantError(f"{patch.id}: {why}, and no variant applies cleanly", hint="; ".join(failures))
    raise NoVariantError(f"{patch.id}: {why}, and several variants apply cleanly "
                         f"({', '.join(v.name for v, _ in clean)}): refusing to guess",
                         hint="the catalog needs a variant that tells these files apart; please report it")


def plan_patch(target: Target, patch: Patch, *, fuzz: int = 0, explicit: bool = False,
               pending: Pending | None = None, planned: dict[str, PatchPlan] | None = None,
               recorded: str | None = None) -> PatchPlan:
    """The plan for one patch. A patch that cannot fit this target is "not-applicable" when it came from the
    default selection, and a refusal when the user asked for it by name (explicit). `recorded`: the variant the
    state says was applied; when its hunks are all in place the patch is already applied, whatever else would
    also fit (on a versionless tree two eras' diffs can share one post-image)."""
    if recorded is not None:
        still = recorded_plan(target, patch, recorded, fuzz, pending)
        if still is not None:
            return still
    reason = not_applicable_reason(target, patch)
    version = target.component_version(patch.component)
    if reason is None:
        reason = unmet_requirement(target, patch, pending, planned)
    if reason:
        if explicit:
            raise RefusedError(f"{patch.id} is not applicable: {reason}",
                               hint="nothing was changed" + (f"; apply {', '.join(patch.requires)} with it"
                                                             if patch.requires else ""))
        return PatchPlan(patch, PlanAction.NOT_APPLICABLE, reason, component_version=version)
    try:
        variant, changes, how = choose_variant(target, patch, fuzz=fuzz, pending=pending)
    except NoVariantError as exc:
        if explicit or version is None:
            raise
        return PatchPlan(patch, PlanAction.NOT_APPLICABLE, exc.message, component_version=version)
    return PatchPlan(patch, action_of(changes), how, variant, version, changes)


def action_of(changes: list[FileChange]) -> PlanAction:
    """ALREADY_APPLIED when every hunk of the variant is in place, else APPLY."""
    all_applied = all(h.state is HunkState.APPLIED for c in changes for h in c.plan.hunks)
    return PlanAction.ALREADY_APPLIED if all_applied else PlanAction.APPLY


def recorded_plan(target: Target, patch: Patch, variant_name: str, fuzz: int,
                  pending: Pending | None) -> PatchPlan | None:
    """An "already-applied" plan when the recorded variant's hunks are all in place; None otherwise."""
    try:
        variant = patch.variant(variant_name)
        changes = plan_variant(target, patch, variant, fuzz=fuzz, pending=pending)
    except ApplierError:
        return None
    if action_of(changes) is not PlanAction.ALREADY_APPLIED:
        return None
    return PatchPlan(patch, PlanAction.ALREADY_APPLIED, f"variant {variant.name} is applied, as recorded", variant,
                     target.component_version(patch.component), changes)


def plan_apply(target: Target, patches: list[Patch], *, fuzz: int = 0, explicit: bool = False,
               recorded: dict[str, str] | None = None) -> list[PatchPlan]:
    """Plan every selected patch in catalog order, each against what the ones before it will have written
    (max-resolution and pil-pixel-limit both edit nodes.py). Raises on the first refusal: all-or-nothing.
    `recorded`: {patch id: variant} from the state."""
    pending: Pending = {}
    plans = []
    planned: dict[str, PatchPlan] = {}
    for patch in patches:
        plan = plan_patch(target, patch, fuzz=fuzz, explicit=explicit, pending=pending, planned=planned,
                          recorded=(recorded or {}).get(patch.id))
        for change in plan.changes:
            pending[change.path] = change.plan.new
        plans.append(plan)
        planned[patch.id] = plan
    return plans


def unmet_requirement(target: Target, patch: Patch, pending: Pending | None = None,
                      planned: dict[str, PatchPlan] | None = None) -> str | None:
    """Why the patch cannot go on this target yet (its `requires_text` / `requires` in patch.toml), or None.

    Text requirements are checked against the bytes each file will hold after the patches planned before it in the
    same run (pending); a required patch must be planned in this run (apply / already-applied) or be applied in the
    files already. Nothing here writes."""
    root = target.component_root(patch.component)
    for requirement in patch.requires_text:
        path = resolve_inside(root, requirement.file, patch_id=patch.id)
        if not requirement.met_by(read_planned(root, path, pending)):
            return f"needs what this tree lacks: {requirement.describe()}"
    for required in patch.requires:
        plan = (planned or {}).get(required)
        if plan is not None and plan.action in (PlanAction.APPLY, PlanAction.ALREADY_APPLIED):
            continue
        if plan is None and _applied_in_files(target, patch, required, pending):
            continue
        return f"needs {required}, which is neither applied nor part of this run"
    return None


def _applied_in_files(target: Target, patch: Patch, required_id: str, pending: Pending | None) -> bool:
    required = next((p for p in patch.required if p.id == required_id), None)
    if required is None:
        return False
    try:
        _, changes, _ = choose_variant(target, required, pending=pending)
    except RefusedError:
        return False
    return action_of(changes) is PlanAction.ALREADY_APPLIED


def clear_record_command(target: Target, patch_id: str) -> str:
    """The command that drops the record of a patch whose files an update replaced, leaving the files as the
    update left them (the same advice from `apply` and `status`)."""
    return f"applier revert --target {target.root} --only {patch_id} --forget"


def reapply_plan(target: Target, patch: Patch, *, fuzz: int = 0) -> PatchPlan:
    """The plan that re-applies a recorded patch an update has undone ("lost"), for `apply` and `status` to share.

    The variant is chosen as for a first apply (by version; a release newer than every range by a clean dry run).
    When none fits, NoVariantError (exit 3) whose message says so and whose hint gives both ways out: the command
    that clears the record, and that the catalog needs a newer applier for this release."""
    try:
        variant, changes, how = choose_variant(target, patch, fuzz=fuzz)
    except NoVariantError as exc:
        version = target.component_version(patch.component) or "of unknown version"
        raise NoVariantError(
            f"{patch.id} is recorded as applied but an update replaced its files, and no variant fits "
            f"{patch.component} {version}: {exc.message}",
            hint=f"`{clear_record_command(target, patch.id)}` clears the record (the files are upstream's now); "
                 f"{NEWER_CATALOG_HINT}") from exc
    return PatchPlan(patch, action_of(changes), how, variant, target.component_version(patch.component), changes)


def stale_advice(target: Target, patch_id: str, reason: str) -> str:
    return (f"{patch_id} cannot be applied again ({reason}); `{clear_record_command(target, patch_id)}` clears "
            f"the record, leaving the files as the update left them; {NEWER_CATALOG_HINT}")
