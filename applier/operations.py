"""The transactions on patches (apply, revert, accept, clean): plan everything first, then hand the file operations
to the journal in one go."""
from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from applier import __version__, diffengine
from applier.catalog import Patch
from applier.catalog.planner import PatchPlan, PlanAction, load_file_patches, plan_apply, stale_advice
from applier.diffengine import HunkState
from applier.errors import DriftError, HunkConflict, IOFailure, RefusedError
from applier.store.applied import AppliedFile, AppliedPatch, State, backup_name
from applier.store.confine import Place
from applier.store.fsutil import MAX_READ_BYTES, io_failure, sha256_bytes
from applier.store.install import Install
from applier.store.journal import Backup, FileOp
from applier.store.record import pristine_hashes
from applier.store.state import StateStore
from applier.strenum import StrEnum, assert_never


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class ApplyResult:
    plans: list[PatchPlan]
    dry_run: bool
    recovered: str | None = None
    warnings: list[str] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)   # (id, advice): lost, and no variant fits now

    @property
    def applied(self) -> list[PatchPlan]:
        return [p for p in self.plans if p.action is PlanAction.APPLY]


def apply(install: Install, patches: list[Patch], *, fuzz: int = 0, dry_run: bool = False,
          explicit: bool = False) -> ApplyResult:
    """Apply every selected patch or none. Already-applied patches are reported and left alone. What the state may
    name is bounded by the install's confinement (the whole catalog, opened by the command's entry, which took its
    lock and read its state: an Install opened with run). Planning reads only; the writes (backups, files, state) are
    handed to the install in one go."""
    state = install.state
    plans = plan_apply(install.target, patches, fuzz=fuzz, explicit=explicit,
                       recorded={pid: rec.variant for pid, rec in state.applied.items()})
    result = ApplyResult(plans, dry_run, install.recovered)
    result.warnings += hardlink_warnings(plans)
    ops, backups = merge_ops(plans), []
    records = [record_plan(plan, fuzz, backups) for plan in result.applied]
    result.stale = stale_records(install, plans, state)
    if dry_run or not result.applied:
        return result
    new_state = state.adding(records)
    install.execute(ops, new_state,
                    f"apply {', '.join(p.patch.id for p in result.applied)} to {install.root}", backups=backups)
    return result


def record_plan(plan: PatchPlan, fuzz: int, backups: list[Backup]) -> AppliedPatch:
    """The state record of one patch about to be applied (State.adding numbers it); the backups of its originals
    are added to `backups` (the journal writes them before any target file)."""
    files = []
    for change in plan.changes:
        backup = None
        if change.plan.old is not None:
            backup = backup_name(plan.patch.id, plan.patch.component, change.relpath)
            backups.append(Backup(backup, change.plan.old, file_stat(change.path)))
        files.append(AppliedFile(
            relpath=change.relpath, sha256_before=digest(change.plan.old), sha256_after=digest(change.plan.new),
            backup=backup, mode=file_mode(change.path)))
    return AppliedPatch(
        id=plan.patch.id, variant=plan.variant.name, component=plan.patch.component, files=files,
        component_version=plan.component_version, applied_at=now(), applier_version=__version__, fuzz=fuzz)


def stale_records(install: Install, plans: list[PatchPlan], state: State) -> list[tuple[str, str]]:
    """Recorded patches whose files an update replaced and that no variant of this catalog can apply again:
    (id, advice). `apply` cannot clear that drift; the advice says what does."""
    out = []
    for plan in plans:
        record = state.applied.get(plan.patch.id)
        if plan.action is not PlanAction.NOT_APPLICABLE or record is None:
            continue
        intact = all(install.confinement.resolve(record.root, f.relpath).sha256() == f.sha256_after for f in record.files)
        if not intact:
            out.append((plan.patch.id, stale_advice(install.target, plan.patch.id, plan.reason)))
    return out


def merge_ops(plans: list[PatchPlan]) -> list[FileOp]:
    """One operation per file, from its bytes now to its bytes after every patch of the run."""
    ops: dict[Path, FileOp] = {}
    for plan in plans:
        if plan.action is not PlanAction.APPLY:
            continue
        for change in plan.changes:
            if change.path in ops:
                ops[change.path].new = change.plan.new
            else:
                ops[change.path] = FileOp(change.path, change.plan.old, change.plan.new)
    return list(ops.values())


def hardlink_warnings(plans: list[PatchPlan]) -> list[str]:
    out = []
    for plan in plans:
        for change in plan.changes:
            st = file_stat(change.path)
            links = 0 if st is None else st.st_nlink
            if links > 1:
                out.append(f"{change.path} has {links} hard links (a uv cache?): applier writes a new file and "
                           "leaves the other links untouched")
    return out


def digest(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


def file_stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def file_mode(path: Path) -> int | None:
    st = file_stat(path)
    return None if st is None else st.st_mode & 0o7777


# ---------------------------------------------------------------- revert

class FileOutcome(StrEnum):
    """What revert, forget or accept did to one file (the "action" of its JSON report)."""
    RESTORED = "restored"              # the backup's original bytes are back
    REVERSED_DIFF = "reversed-diff"    # only the patch's hunks were reversed, other edits kept
    DELETED = "deleted"                # the patch had created the file
    UNCHANGED = "unchanged"            # it already held the bytes wanted
    LOST = "lost"                      # an update replaced or removed it: nothing to restore, the backup is kept
    FORCED = "forced"                  # --force: the original restored, the current bytes saved under displaced/
    FORGOTTEN = "forgotten"            # the record dropped, the file left as it is
    ACCEPTED = "accepted"              # its current bytes are now the patched state


def backup_done_with(outcome: FileOutcome) -> bool:
    """Whether the file's backup may go once a revert had this outcome: no longer needed once the file holds its
    original (or only lost the patch's hunks); kept where an update replaced the file (it may hold bytes nobody else
    has) and where the record was only forgotten (the backups move to displaced/)."""
    match outcome:
        case (FileOutcome.RESTORED | FileOutcome.REVERSED_DIFF | FileOutcome.DELETED | FileOutcome.UNCHANGED
              | FileOutcome.FORCED):
            return True
        case FileOutcome.LOST | FileOutcome.FORGOTTEN | FileOutcome.ACCEPTED:
            return False
        case _:
            assert_never(outcome)


@dataclass
class FileRevert:
    path: str
    action: FileOutcome
    note: str = ""


@dataclass
class RevertReport:
    id: str
    files: list[FileRevert]


@dataclass
class RevertResult:
    reports: list[RevertReport]
    recovered: str | None = None
    displaced: Path | None = None


# What happens to one file of one recorded patch: (outcome, the file's bytes afterwards, a note). Given the file's
# bytes as the patches undone before it in the same run leave them.
FileUndo = Callable[[StateStore, AppliedPatch, AppliedFile, bytes | None], tuple[FileOutcome, bytes | None, str]]


def revert(install: Install, catalog: list[Patch], only: tuple[str, ...] = (), *, force: bool = False,
           dry_run: bool = False) -> RevertResult:
    """Restore the exact original bytes of every selected applied patch (latest first)."""
    by_id = {p.id: p for p in catalog}
    # torch's RECORD, read under the lock
    pristine = functools.cache(lambda: pristine_hashes(install.target.site_packages))

    def restore(store: StateStore, rec: AppliedPatch, f: AppliedFile, current: bytes | None):
        return revert_file(store, rec, f, current, by_id.get(rec.id), pristine(), force)
    return drop_records(install, only, restore, dry_run=dry_run)


def forget(install: Install, only: tuple[str, ...] = (), *, dry_run: bool = False) -> RevertResult:
    """Drop the records of the selected applied patches and leave their files as they are (for patches an update
    replaced and no variant can reach any more); their backups move to .applier/displaced/. `applier revert
    --forget` on the command line."""
    def leave(store: StateStore, rec: AppliedPatch, f: AppliedFile, current: bytes | None):
        return FileOutcome.FORGOTTEN, current, "record dropped, file left as it is"
    return drop_records(install, only, leave, dry_run=dry_run)


def drop_records(install: Install, only: tuple[str, ...], undo_file: FileUndo, *, dry_run: bool) -> RevertResult:
    """Revert and forget: undo_file decides each file of the selected records (latest patch first), then one
    journal run writes the files and the state without those records, and the backups no longer needed go."""
    store = install.store
    if not install.locked or not store.state_file.exists():   # opening the run finished any interrupted one first
        if only:
            raise RefusedError(f"nothing recorded as applied in {install.root}: cannot revert {', '.join(only)}",
                               hint="`applier status` lists what is applied")
        return RevertResult([], install.recovered)
    recovered = install.recovered
    state = install.state
    chosen = [rec for _, rec in state.in_order() if not only or rec.id in only or rec.component in only]
    unknown = [name for name in only if name not in state.applied and name not in ("comfyui", "torch")]
    if unknown:
        raise RefusedError(f"not recorded as applied: {', '.join(unknown)}",
                           hint="`applier status` lists what is applied")
    pending: dict[Place, bytes | None] = {}
    originals: dict[Place, bytes | None] = {}
    displaced: list[tuple[Place, bytes]] = []
    reports = []
    for rec in reversed(chosen):
        files = []
        for f in rec.files:
            path = store.path_of(rec, f)
            if path not in pending:
                originals[path] = pending[path] = path.read(limit=MAX_READ_BYTES)
            outcome, new, note = undo_file(store, rec, f, pending[path])
            if outcome is FileOutcome.FORCED and pending[path] is not None:
                displaced.append((path, pending[path]))
            pending[path] = new
            files.append(FileRevert(str(path), outcome, note))
        reports.append(RevertReport(rec.id, files))
    result = RevertResult(reports, recovered)
    if dry_run:
        return result
    if displaced:
        result.displaced = store.save_displaced(displaced)
    ops = [FileOp(path, originals[path], pending[path]) for path in pending if originals[path] != pending[path]]
    chosen_ids = {rec.id for rec in chosen}
    new_state = State({k: v for k, v in state.applied.items() if k not in chosen_ids})
    install.execute(ops, new_state, f"revert {', '.join(r.id for r in chosen)} in {install.root}")
    try:
        tidy_after_revert(store, reports, new_state)
    except (OSError, IOFailure) as exc:
        raise done_but_untidy(exc, store.backups, ", ".join(r.id for r in chosen)) from exc
    return result


def shown_path(exc: OSError, where: Path) -> Path:
    """The path an OSError names, where it is a whole path (a call relative to a held folder names only the last
    component): else the folder it happened in."""
    return Path(exc.filename) if isinstance(exc.filename, str) and os.path.isabs(exc.filename) else where


def done_but_untidy(exc: Exception, where: Path, what: str) -> IOFailure:
    """The run is done and recorded, only its clearing up of the state folder was refused (exit 8): said so."""
    failure = exc if isinstance(exc, IOFailure) else io_failure(exc, shown_path(exc, where), "remove")
    return IOFailure(f"{what}: done (the files are written and the state recorded), but {failure.message}",
                     hint=f"nothing needs finishing; what it could not remove stays in {where}: remove it as its "
                          "owner (or run `applier clean` as that user once nothing is applied)")


def tidy_after_revert(store: StateStore, reports: list[RevertReport], state: State) -> None:
    """Remove the backups a revert no longer needs: those of patches whose every file got its original back (a
    backup of a file an update replaced is kept: it may hold bytes nobody else has; a forgotten patch's backups
    move to displaced/). With nothing applied, `.applier/` keeps only what must stay (the lock, displaced bytes,
    an overlay manifest)."""
    for report in reports:
        if all(backup_done_with(f.action) for f in report.files):
            store.remove_tree(store.backups / report.id)
        elif all(f.action is FileOutcome.FORGOTTEN for f in report.files) and (store.backups / report.id).is_dir():
            folder = store.new_folder(store.displaced / time.strftime("%Y%m%d-%H%M%S"))
            store.rename(store.backups / report.id, folder / "backups" / report.id)
    store.prune_empty(store.backups)
    if not state.applied:
        store.remove(store.state_file)


def revert_file(store: StateStore, rec: AppliedPatch, f: AppliedFile, current: bytes | None,
                patch: Patch | None, pristine: dict[str, str], force: bool) -> tuple[FileOutcome, bytes | None, str]:
    """(what was done, the file's bytes afterwards, a note) for one file of one applied patch."""
    current_sha = digest(current)
    backup = store.read_backup(rec, f)
    backup_ok = f.sha256_before is None or (backup is not None and sha256_bytes(backup) == f.sha256_before)
    if f.accepted and current is not None and current_sha != f.sha256_before:
        # The file holds edits the user accepted as the patched state: restoring the backup would lose them.
        found = reverse_in_place(rec, f, current, patch)
        match found:
            case HunksReversed(new):
                return (FileOutcome.REVERSED_DIFF, new,
                        "reversed only the patch's hunks; the edits you accepted are kept")
            case HunksAbsent() | HunksUntold():
                return forced_restore(store, rec, f, backup if backup_ok else None, force,
                                      "holds edits accepted with `applier accept`, and the patch's hunks cannot be "
                                      "reversed alone")
            case _:
                assert_never(found)
    if current_sha == f.sha256_after and backup_ok:
        if f.sha256_before is None:
            return FileOutcome.DELETED, None, "created by the patch"
        return FileOutcome.RESTORED, backup, "original bytes restored from the backup"
    if current_sha == f.sha256_before:
        return FileOutcome.UNCHANGED, current, "already holds its original bytes"
    if current is None:
        return (FileOutcome.LOST, None,
                "the file is gone (an update removed it?): nothing to restore; its backup is kept")
    found = reverse_in_place(rec, f, current, patch)
    match found:
        case HunksReversed(new):
            note = ("backup missing or damaged: reversed the diff" if current_sha == f.sha256_after
                    else "file edited since apply: reversed only the patch's hunks, other edits kept")
            return FileOutcome.REVERSED_DIFF, new, note
        case HunksAbsent():
            return FileOutcome.LOST, current, "the patch is no longer in the file (an update or an edit removed it)"
        case HunksUntold():
            if rec.component == "torch" and f.relpath in pristine and current_sha == pristine[f.relpath]:
                return FileOutcome.LOST, current, "an update replaced the file (matches RECORD); nothing to restore"
            return forced_restore(store, rec, f, backup if backup_ok else None, force,
                                  f"changed since {rec.id} was applied and its patched region is not intact")
        case _:
            assert_never(found)


def forced_restore(store: StateStore, rec: AppliedPatch, f: AppliedFile, backup: bytes | None, force: bool,
                   why: str) -> tuple[FileOutcome, bytes | None, str]:
    """A file only --force may restore: refused without it (exit 5), refused with it when no intact backup
    exists; else the backup's bytes, the current ones being saved under displaced/ by the caller."""
    path = store.path_of(rec, f)
    if not force:
        raise DriftError(f"{path} {why}",
                         hint="`applier status` shows the drift; `applier revert --force` restores the original "
                              "bytes after saving the current ones under .applier/displaced/")
    if backup is None and f.sha256_before is not None:
        raise DriftError(f"{path}: no intact backup to restore even with --force",
                         hint=f"the backup {f.backup} is missing or damaged; restore the file by reinstalling")
    return FileOutcome.FORCED, backup, "current bytes saved under .applier/displaced/, original restored"


@dataclass(frozen=True)
class HunksReversed:
    """Only this patch's hunks reversed: the file's bytes afterwards."""
    new: bytes | None


@dataclass(frozen=True)
class HunksAbsent:
    """None of the patch's hunks is in the file."""


@dataclass(frozen=True)
class HunksUntold:
    """Cannot be told: the hunks are not intact, or the catalog lacks the patch or its variant."""


InPlace = HunksReversed | HunksAbsent | HunksUntold


def reverse_in_place(rec: AppliedPatch, f: AppliedFile, current: bytes | None, patch: Patch | None) -> InPlace:
    """The patch's hunks reversed in the file as it is now, whatever else was edited around them."""
    if patch is None:
        return HunksUntold()
    try:
        variant = patch.variant(rec.variant)
        file_patches = [fp for fp in load_file_patches(patch, variant) if fp.path == f.relpath]
    except RefusedError:
        return HunksUntold()
    if not file_patches:
        return HunksUntold()
    try:
        plan = diffengine.plan_file(diffengine.reverse_file_patch(file_patches[0]), current, fuzz=rec.fuzz)
    except HunkConflict:
        return HunksUntold()
    # Reversing reports APPLIED for a hunk whose original text is already there.
    if all(h.state is HunkState.APPLIED for h in plan.hunks):
        return HunksAbsent()
    return HunksReversed(plan.new)


# ---------------------------------------------------------------- accept

@dataclass
class AcceptReport:
    id: str
    files: list[FileRevert]


def accept(install: Install, catalog: list[Patch], only: tuple[str, ...]) -> list[AcceptReport]:
    """Take the current bytes of each file of the named applied patches, edited by hand since apply, as their new
    patched state. Only where the patch's hunks are all still in the file (status "modified"); the record's
    sha256_after becomes the file's hash and the file is marked accepted, so that a later revert reverses only
    the patch's hunks and keeps the edits (or, with --force, saves them under displaced/ first)."""
    if not only:
        raise RefusedError("accept needs the patches to accept: --only ID (repeatable)",
                           hint="`applier status` lists the modified ones")
    store = install.store
    store.check_folder()
    state = install.state
    by_id = {p.id: p for p in catalog}
    unknown = [name for name in only if name not in state.applied]
    if unknown:
        raise RefusedError(f"not recorded as applied: {', '.join(unknown)}",
                           hint="`applier status` lists what is applied; `applier apply --only ID` applies it")
    new_state = State(dict(state.applied))
    reports = []
    for patch_id in only:
        rec = state.applied[patch_id]
        files = []
        new_files = []
        for f in rec.files:
            path = store.path_of(rec, f)
            current = path.read(limit=MAX_READ_BYTES)
            if current is None or digest(current) == f.sha256_after:
                files.append(FileRevert(str(path), FileOutcome.UNCHANGED, "holds the recorded patched bytes"))
                new_files.append(f)
                continue
            writer = state.last_writer(rec.component, f.relpath)
            if writer is not None and writer.id != rec.id:
                raise RefusedError(f"{path}: {writer.id} was applied on top of {rec.id}",
                                   hint=f"accept {writer.id} instead: it wrote the file last")
            if not isinstance(reverse_in_place(rec, f, current, by_id.get(rec.id)), HunksReversed):
                raise RefusedError(f"{path}: the hunks of {rec.id} are not all in the file, so it is not a "
                                   "patched file that could be accepted",
                                   hint=f"`applier revert --target {install.root} --only {rec.id} --forget` drops "
                                        "the record and leaves the file as it is")
            new_files.append(AppliedFile(f.relpath, f.sha256_before, digest(current), f.backup, f.mode,
                                         accepted=True))
            files.append(FileRevert(str(path), FileOutcome.ACCEPTED, "its current bytes are now the patched state"))
        new_state.applied[patch_id] = AppliedPatch(
            id=rec.id, variant=rec.variant, component=rec.component, files=new_files,
            component_version=rec.component_version, applied_at=rec.applied_at,
            applier_version=rec.applier_version, seq=rec.seq, fuzz=rec.fuzz)
        reports.append(AcceptReport(patch_id, files))
    install.execute([], new_state, f"accept the edited files of {', '.join(only)} in {install.root}")
    return reports


# ---------------------------------------------------------------- clean

@dataclass
class CleanResult:
    removed: bool                 # .applier/ is gone
    kept: list[str]               # what stays, and why
    existed: bool = True          # there was a .applier/ to clean


def clean(install: Install) -> CleanResult:
    """Remove `.applier/` from a target where nothing is applied and no overlay is installed. Bytes a forced
    revert saved (displaced/) are never removed: the folder then keeps only them."""
    store = install.store
    store.check_folder()
    if not os.path.lexists(store.dir):
        return CleanResult(False, [], existed=False)
    state = install.state
    if state.applied:
        raise RefusedError(f"patches are applied in {install.root}: {', '.join(sorted(state.applied))}",
                           hint=f"`applier revert --target {install.root}` first")
    if store.overlay_manifest.exists():
        raise RefusedError(f"an overlay pack is installed in {install.root}",
                           hint=f"`applier overlay uninstall --target {install.root}` first")
    try:
        for name in ("state.json", "journal.json", "python.json"):
            store.remove(store.dir / name)
        for folder in ("backups", "journal-data"):
            store.remove_tree(store.dir / folder)
    except (OSError, IOFailure) as exc:
        failure = exc if isinstance(exc, IOFailure) else io_failure(exc, shown_path(exc, store.dir), "remove")
        raise IOFailure(failure.message, hint=f"part of {store.dir} may be removed already: only applier's own "
                                              "records of an install where nothing is applied, nothing else; fix "
                                              "the permissions and run `applier clean` again") from exc
    if store.displaced.exists():
        return CleanResult(False, [f"{store.displaced}: bytes a forced revert or uninstall saved; remove them "
                                   "by hand once you no longer need them"])
    store.remove_tree(store.dir)
    return CleanResult(not os.path.lexists(store.dir), [])
