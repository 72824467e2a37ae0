"""Check the catalog against cached upstream releases: does every variant apply where it claims to, and only there?

The cache is a folder of pristine upstream files, filled by scripts outside the package
(`python -m benchmarks upstream torch` and `upstream comfyui`):

    <cache>/<component>/<version>/<paths relative to the component root>
    e.g. <cache>/torch/2.13.0/torch/cuda/streams.py, <cache>/comfyui/0.3.64/nodes.py

For every variant of every patch and every cached version of its component, the variant's diff (the patch's shared
diffs and its own, through planner.load_file_patches as for apply) is planned against
the cached files with the diff engine (no fuzz; offsets are fine) and the result is reversed; the round trip must
give the original bytes back. Each (variant, version) gets one cell:

    clean                    claimed by the variant's specifier, applies and reverses byte for byte
    fails                    claimed, but does not apply (or does not reverse exactly): a problem
    not claimed but applies  the diff fits a version the specifier leaves out: a warning (widen the specifier?)
    claimed but missing      the variant's `tested` list names a version that is not in the cache: a problem
    n/a                      not claimed and does not apply

Versions that are not PEP 440 (e.g. "unversioned-2023-03-22-abc1234", a snapshot of an old checkout) have no
specifier to match: for them the check asserts that exactly one variant applies cleanly, which is what selection
by dry run needs; a variant whose `tested` names a snapshot claims it (it must be that clean one). Variants of one
patch must not both claim any cached or tested release.

Nothing here prints or writes; `python -m benchmarks coverage` renders the report as docs/coverage.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from applier import diffengine
from applier.catalog.patch import Patch, Variant
from applier.catalog.planner import load_file_patches
from applier.diffengine import HunkState
from applier.errors import ApplierError
from applier.strenum import StrEnum


class CellState(StrEnum):
    CLEAN = "clean"
    FAILS = "fails"
    UNCLAIMED_APPLIES = "not claimed but applies"
    CLAIMED_MISSING = "claimed but missing in cache"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class CoverageCell:
    version: str
    state: CellState
    claimed: bool          # the specifier covers the version; for a snapshot: `tested` names it
    detail: str = ""       # why it failed, or the offsets it applied at


@dataclass(frozen=True)
class CoverageRow:
    patch_id: str
    component: str
    variant: str
    versions: str          # the specifier as written
    cells: tuple[CoverageCell, ...]

    def cell(self, version: str) -> CoverageCell | None:
        return next((c for c in self.cells if c.version == version), None)


@dataclass
class CoverageReport:
    cache_root: Path
    versions: dict[str, tuple[str, ...]]          # component -> the versions of the matrix's columns, in order
    rows: list[CoverageRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # the catalog is wrong: `catalog check` fails
    warnings: list[str] = field(default_factory=list)   # worth a look, not wrong

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class RoundTrip:
    applies: bool
    detail: str


def is_release_version(label: str) -> bool:
    """True for a PEP 440 version ("2.13.0", "0.3.64"); False for a snapshot label ("unversioned-2023-...")."""
    try:
        Version(label)
    except InvalidVersion:
        return False
    return True


def version_sort_key(label: str) -> tuple:
    # Releases in version order first, then snapshot labels in name order (their labels start with a date).
    return (0, Version(label), "") if is_release_version(label) else (1, Version("0"), label)


def cached_versions(cache_root: Path, component: str) -> tuple[str, ...]:
    folder = Path(cache_root) / component
    if not folder.is_dir():
        return ()
    labels = [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]
    return tuple(sorted(labels, key=version_sort_key))


def round_trip(variant: Variant, version_root: Path, patch: Patch | None = None) -> RoundTrip:
    """Plan the variant on the files under version_root, reverse the result, demand the original bytes back.

    With the patch given, its file patches come from planner.load_file_patches (shared diffs included, unsafe paths
    refused), as for apply; its `requires_text` must hold in the cached files too."""
    try:
        if patch is not None:
            file_patches = load_file_patches(patch, variant)
        else:
            file_patches = diffengine.parse_patch(variant.read_diff())
    except (ApplierError, OSError) as exc:
        return RoundTrip(False, f"diff unreadable: {exc}")
    if patch is not None:
        for requirement in patch.requires_text:
            path = version_root / requirement.file
            if not requirement.met_by(path.read_bytes() if path.is_file() else None):
                return RoundTrip(False, f"requirement unmet: {requirement.describe()}")
    notes = []
    for fp in file_patches:
        path = version_root / fp.path
        original = path.read_bytes() if path.is_file() else None
        if original is None and not fp.is_new:
            return RoundTrip(False, f"{fp.path} does not exist in this version")
        try:
            forward = diffengine.plan_file(fp, original)
        except ApplierError as exc:
            return RoundTrip(False, _first_line(str(exc)))
        not_pending = [h for h in forward.hunks if h.state is not HunkState.NOT_APPLIED]
        if not_pending:
            # Pristine upstream text must take every hunk; "already applied" here means the diff is wrong.
            states = ", ".join(f"hunk #{h.index} {h.state.value}" for h in not_pending)
            return RoundTrip(False, f"{fp.path}: {states}")
        if not forward.changed:
            return RoundTrip(False, f"{fp.path}: the diff changes nothing")
        try:
            backward = diffengine.plan_file(diffengine.reverse_file_patch(fp), forward.new)
        except ApplierError as exc:
            return RoundTrip(False, f"reverse: {_first_line(str(exc))}")
        if backward.new != original:
            return RoundTrip(False, f"{fp.path}: reversing does not restore the original bytes")
        notes += [f"{fp.path} hunk #{h.index} offset {h.offset:+d}" for h in forward.hunks if h.offset]
    return RoundTrip(True, "; ".join(notes))


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def check_patch(patch: Patch, cache_root: Path, versions: tuple[str, ...], columns: tuple[str, ...],
                report: CoverageReport) -> None:
    """Add the patch's rows to report; versions are the cached ones, columns those plus any tested elsewhere."""
    component_root = Path(cache_root) / patch.component
    clean_by_snapshot: dict[str, list[str]] = {label: [] for label in versions if not is_release_version(label)}

    for variant in patch.variants:
        where = f"{patch.id} variant {variant.name!r}"
        for tested in variant.tested:
            # A snapshot label in tested claims "selected by dry run there"; a release must be in the specifier.
            if is_release_version(tested) and not variant.covers(tested):
                report.problems.append(f"{where}: tested lists {tested}, outside its versions {variant.versions}")
        cells = []
        for label in columns:
            release = is_release_version(label)
            claimed = variant.covers(label) if release else label in variant.tested
            if label not in versions:
                if label in variant.tested:
                    cells.append(CoverageCell(label, CellState.CLAIMED_MISSING, claimed,
                                              f"{component_root / label} is not cached"))
                    report.problems.append(f"{where}: tested lists {label}, which is not in the cache "
                                           f"(fetch it, or drop it from tested)")
                else:
                    cells.append(CoverageCell(label, CellState.NOT_APPLICABLE, claimed, "not cached"))
                continue
            result = round_trip(variant, component_root / label, patch)
            if not release and result.applies:
                clean_by_snapshot[label].append(variant.name)
            if not release and not claimed:
                state = CellState.CLEAN if result.applies else CellState.NOT_APPLICABLE
            elif claimed and result.applies:
                state = CellState.CLEAN
            elif claimed:
                state = CellState.FAILS
                report.problems.append(f"{where} claims {label} but does not apply there: {result.detail}")
            elif result.applies:
                state = CellState.UNCLAIMED_APPLIES
                report.warnings.append(f"{where} applies cleanly to {label}, which its versions "
                                       f"{variant.versions} leave out")
            else:
                state = CellState.NOT_APPLICABLE
            if claimed and result.applies and label not in variant.tested:
                report.warnings.append(f"{where}: {label} applies cleanly but is not listed in tested")
            cells.append(CoverageCell(label, state, claimed, result.detail))
        report.rows.append(CoverageRow(patch.id, patch.component, variant.name, str(variant.versions),
                                       tuple(cells)))

    for label in columns:
        if not is_release_version(label):
            continue
        claiming = [v.name for v in patch.variants if v.covers(label)]
        if len(claiming) > 1:
            report.problems.append(f"{patch.id}: variants {', '.join(claiming)} all claim {label}")
    for label, clean in clean_by_snapshot.items():
        if len(clean) != 1:
            found = ", ".join(clean) if clean else "none"
            report.problems.append(f"{patch.id}: snapshot {label} needs exactly one cleanly applying variant "
                                   f"for selection by dry run; found {found}")


def check_catalog(catalog: list[Patch], cache_root: Path) -> CoverageReport:
    """Dry-run every variant of every patch against every cached upstream version of its component."""
    cache_root = Path(cache_root)
    components = sorted({p.component for p in catalog})
    report = CoverageReport(cache_root=cache_root, versions={})
    for component in components:
        versions = cached_versions(cache_root, component)
        if not versions:
            report.warnings.append(f"no cached {component} versions under {cache_root / component}")
        patches = [p for p in catalog if p.component == component]
        tested = {t for p in patches for v in p.variants for t in v.tested}
        columns = versions + tuple(sorted(tested - set(versions), key=version_sort_key))
        report.versions[component] = columns
        for patch in patches:
            check_patch(patch, cache_root, versions, columns, report)
    return report


__all__ = ["CellState", "CoverageCell", "CoverageRow", "CoverageReport", "RoundTrip", "check_catalog",
           "check_patch", "round_trip", "cached_versions", "is_release_version", "version_sort_key"]
