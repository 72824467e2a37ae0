"""Planning: which variant of each patch fits the target, and what every file would become. Reads, never writes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from applier import diffengine
from applier.catalog import Patch, Variant
from applier.diffengine import FilePatch, FilePlan, HunkState
from applier.errors import ApplierError, HunkConflict, NoVariantError, RefusedError
from applier.fsutil import read_bytes_or_none
from applier.paths import resolve_inside
from applier.target import Target


@dataclass
class FileChange:
    relpath: str
    path: Path
    plan: FilePlan


@dataclass
class PatchPlan:
    patch: Patch
    action: str                       # "apply" | "already-applied" | "not-applicable"
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
            return "the target's site-packages could not be determined"
        if target.torch_version is None:
            return f"torch is not installed in {root}"
    return None


def load_file_patches(patch: Patch, variant: Variant) -> list[FilePatch]:
    try:
        return diffengine.parse_patch(variant.read_diff())
    except ApplierError as exc:
        raise RefusedError(f"{patch.id} variant {variant.name}: {exc.message}") from exc


Pending = dict  # {Path: bytes | None}: what earlier patches of the same run will have written


def read_planned(path: Path, pending: Pending | None) -> bytes | None:
    if pending is not None and path in pending:
        return pending[path]
    return read_bytes_or_none(path)


def plan_variant(target: Target, patch: Patch, variant: Variant, *, fuzz: int = 0, reverse: bool = False,
                 pending: Pending | None = None) -> list[FileChange]:
    """Plan every file of one variant; HunkConflict when a hunk does not fit."""
    root = target.component_root(patch.component)
    changes = []
    for fp in load_file_patches(patch, variant):
        path = resolve_inside(root, fp.path, patch_id=patch.id)
        original = read_planned(path, pending)
        changes.append(FileChange(fp.path, path, diffengine.plan_file(fp, original, reverse=reverse, fuzz=fuzz)))
    return changes


def choose_variant(target: Target, patch: Patch, *, fuzz: int = 0,
                   pending: Pending | None = None) -> tuple[Variant, list[FileChange], str]:
    """(variant, its file plans, how it was chosen).

    By version when known; a version no variant claims is refused. When the version is unknown, or the variant
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
        raise NoVariantError(f"{patch.id} has no variant for {patch.component} {version} (variants: {claimed})",
                             hint="a maintainer adds one with `applier catalog refresh` (patches/README.md)")
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
        return variant, changes, f"{why}; only variant {variant.name} applies cleanly (dry run)"
    if not clean:
        raise NoVariantError(f"{patch.id}: {why}, and no variant applies cleanly", hint="; ".join(failures))
    raise NoVariantError(f"{patch.id}: {why}, and several variants apply cleanly "
                         f"({', '.join(v.name for v, _ in clean)}): refusing to guess",
                         hint="the catalog needs a variant that tells these files apart; please report it")


def plan_patch(target: Target, patch: Patch, *, fuzz: int = 0, explicit: bool = False,
               pending: Pending | None = None) -> PatchPlan:
    """The plan for one patch. A patch that cannot fit this target is "not-applicable" when it came from the
    default selection, and a refusal when the user asked for it by name (explicit)."""
    reason = not_applicable_reason(target, patch)
    version = target.component_version(patch.component)
    if reason:
        if explicit:
            raise RefusedError(f"{patch.id} is not applicable: {reason}")
        return PatchPlan(patch, "not-applicable", reason, component_version=version)
    try:
        variant, changes, how = choose_variant(target, patch, fuzz=fuzz, pending=pending)
    except NoVariantError as exc:
        if explicit or version is None:
            raise
        return PatchPlan(patch, "not-applicable", exc.message, component_version=version)
    all_applied = all(h.state == HunkState.APPLIED for c in changes for h in c.plan.hunks)
    action = "already-applied" if all_applied else "apply"
    return PatchPlan(patch, action, how, variant, version, changes)


def plan_apply(target: Target, patches: list[Patch], *, fuzz: int = 0, explicit: bool = False) -> list[PatchPlan]:
    """Plan every selected patch in catalog order, each against what the ones before it will have written
    (max-resolution and pil-pixel-limit both edit nodes.py). Raises on the first refusal: all-or-nothing."""
    pending: Pending = {}
    plans = []
    for patch in patches:
        plan = plan_patch(target, patch, fuzz=fuzz, explicit=explicit, pending=pending)
        for change in plan.changes:
            pending[change.path] = change.plan.new
        plans.append(plan)
    return plans
