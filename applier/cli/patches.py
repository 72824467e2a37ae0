"""The patch verbs: detect, list, status, apply, revert (and its --forget), accept, clean, explain; what each prints
and its exit code. The work is operations' and status's; this module parses, calls and says."""
from __future__ import annotations

import sys

import click

from applier.catalog import COMPONENTS, select_patches
from applier.cli.group import (Invocation, cli, json_option, out_json, pass_invocation, patches_option,
                               remember_interpreter, say_interpreter, target_options)
from applier.errors import EXIT_DRIFT, ApplierError, RefusedError
from applier.strenum import assert_never


@cli.command()
@target_options
def detect(invocation):
    """Show ComfyUI version and layout, its Python env, torch/CUDA/triton and GPU (never imports torch).

    Example: applier detect --target ComfyUI/
    """
    found = invocation.target(gpu=True)
    if invocation.as_json:
        return out_json(found.to_json())
    rows = [
        ("target", f"{found.root} ({found.layout})"),
        ("ComfyUI", f"{found.comfyui_root or '-'}"),
        ("ComfyUI version", f"{found.comfyui_version or 'unknown'} (from {found.comfyui_version_source})"
                            + (f", commit {found.comfyui_commit}" if found.comfyui_commit else "")),
        ("python", f"{found.python or '-'} ({found.python_source}"
                   + (f", {found.python_version})" if found.python_version else ")")
                   + (" not usable: see the note" if found.python_problem else "")),
        ("site-packages", str(found.site_packages or "-") + (" (not used: see the note)"
                                                             if found.site_packages_problem else "")),
        *([("own site-packages", f"{found.purelib or '-'} (the overlay package's home; torch is in a parent "
                                 "environment)")] if found.purelib != found.site_packages else []),
        ("torch", (found.torch_version or "not installed") + (f", CUDA {found.torch_cuda}" if found.torch_cuda
                                                              else "")),
        ("triton", found.triton_version or "not installed"),
        ("GPU", ", ".join(f"{g.name} (sm {g.compute_capability})" for g in found.gpus)
         or ("unknown (see the note)" if found.gpu_problem else "none found")),
    ]
    print_rows(rows)
    for note in found.notes:
        click.echo(f"note: {note}")


def print_rows(rows):
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


# ------------------------------------------------------------------ list / status

@cli.command("list")
@target_options
def list_cmd(invocation):
    """List the catalog: each patch, the variant that fits this install, and its status.

    Example: applier list --target ComfyUI/
    """
    from applier.status import PatchState
    statuses, found, _ = compute_statuses(invocation)
    catalog = {p.id: p for p in invocation.catalog}
    if invocation.as_json:
        return out_json({"target": str(found.root), "patches": [
            {**s.to_json(), "title": catalog[s.id].title if s.id in catalog else None,
             "default": catalog[s.id].default if s.id in catalog else None,
             "variants": [{"name": v.name, "versions": str(v.versions)} for v in catalog[s.id].variants]
             if s.id in catalog else []} for s in statuses]})
    for s in statuses:
        patch = catalog.get(s.id)
        title = patch.title if patch else "(not in the catalog any more)"
        flag = "" if patch is None or patch.default else "  [opt-in: --only]"
        click.echo(f"{s.id:32} {s.state:15} {('variant ' + s.variant) if s.variant else '':22} {title}{flag}")
        if s.state in (PatchState.NOT_APPLICABLE, PatchState.CONFLICT):
            click.echo(f"{'':32} {s.reason}")


def compute_statuses(invocation: Invocation, only: tuple[str, ...] = ()):
    from applier.catalog.allowlist import store_for
    from applier.status import compute_status, needs_second_look
    from applier.store.journal import recover, recover_if_pending
    found = invocation.target()
    catalog = invocation.catalog
    check_known(catalog, only)
    store = store_for(found, catalog)
    recovered = recover_if_pending(store)
    before = store.fingerprint()
    statuses = compute_status(found, catalog, store.load(), only, store.confinement)
    if store.dir.is_dir() and (needs_second_look(statuses) or store.fingerprint() != before):
        # A run in flight (files written, state not yet) looks like drift, or like a patch found in the files but
        # not recorded, to a reader that takes no lock: look again under the lock, once that run is done.
        try:
            with store.locked(reader=True):
                recovered = recover(store) or recovered
                statuses = compute_status(found, catalog, store.load(), only, store.confinement)
        except ApplierError as exc:
            if exc.exit_code != 8:  # a target we may not write (no lock file possible): the first reading stands
                raise
    return statuses, found, recovered


def check_known(catalog, only: tuple[str, ...]) -> None:
    """An unknown patch id is exit 3 in every command."""
    select_patches(catalog, only)


def complete_patch_ids(ctx, param, incomplete):
    """Shell completion of patch ids (and component names) from the catalog --patches names, or the packaged one."""
    try:
        catalog = ctx.ensure_object(Invocation).catalog
    except Exception:  # completion must never print a traceback into the user's shell
        return []
    names = [p.id for p in catalog] + list(COMPONENTS)
    return [name for name in names if name.startswith(incomplete)]


@cli.command()
@target_options
@click.option("--only", multiple=True, metavar="ID", shell_complete=complete_patch_ids,
              help="Only this patch id, or a component (comfyui, torch). Repeatable.")
def status(invocation, only):
    """Per patch: applied / not applied / lost (an update replaced the file) / modified. Exit 5 on drift.

    Example: applier status --target ComfyUI/
    """
    from applier.status import DRIFT, PatchState, node_pack_installs, node_pack_lines, parts_line
    statuses, found, recovered = compute_statuses(invocation, tuple(only))
    drift = [s for s in statuses if s.state in DRIFT]
    node_pack = node_pack_installs(found) if found.comfyui_root and not only else None
    if invocation.as_json:
        out_json({"target": str(found.root), "python": str(found.python) if found.python else None,
                  "site_packages": str(found.site_packages) if found.site_packages else None,
                  "purelib": str(found.purelib) if found.purelib else None,
                  "recovered": recovered, "drift": bool(drift), "patches": [s.to_json() for s in statuses],
                  **({} if node_pack is None else {"node_pack": node_pack})})
    else:
        say_interpreter(found)
        if recovered:
            click.echo(recovered)
        for s in statuses:
            click.echo(f"{s.id:32} " + click.style(f"{s.state:15}", fg=state_color(s.state)) + f" {s.reason}")
            for f in s.files:
                if f.state is not PatchState.APPLIED:
                    click.echo(f"{'':32}   {f.state}: {f.path} {f.note}")
        for line in drift_advice(found.root, drift) + (node_pack_lines(node_pack) if node_pack is not None else []):
            click.echo(line)
        if not only and parts_line(found):
            click.echo(parts_line(found))
    if drift:
        sys.exit(EXIT_DRIFT)


def state_color(state) -> str | None:
    """The colour of a patch's status: green when applied, yellow for drift, red for a conflict."""
    from applier.status import PatchState
    match state:
        case PatchState.APPLIED:
            return "green"
        case PatchState.LOST | PatchState.MODIFIED:
            return "yellow"
        case PatchState.CONFLICT:
            return "red"
        case PatchState.NOT_APPLIED | PatchState.PARTIAL | PatchState.NOT_APPLICABLE:
            return None
        case _:
            assert_never(state)


def drift_advice(root, drift) -> list[str]:
    """What works after drift, per patch: lost ones are re-applied; for a hand edit, each way out, worded for what
    it does to the edit."""
    from applier.status import PatchState
    lines = []
    lost = [s.id for s in drift if s.state is PatchState.LOST]
    if lost:
        lines.append(f"lost ({', '.join(lost)}): `applier apply --target {root}` applies them again")
    for s in drift:
        if s.state is not PatchState.MODIFIED:
            continue
        base = f"applier revert --target {root} --only {s.id}"
        lines += [f"modified ({s.id}): the patch is in place and the file was edited since. Choose:",
                  f"  keep the edit as the patched state:      applier accept --target {root} --only {s.id}",
                  f"  keep the edit, drop the patch's hunks:   {base}",
                  f"  keep the file as it is, drop the record: {base} --forget",
                  f"  back to the original bytes:              {base} --force   (the edit is saved under "
                  ".applier/displaced/)"]
    return lines


# ------------------------------------------------------------------ apply / revert

class WholeNumber(click.IntRange):
    """A whole number from min to max; anything else (a fraction, nan, a word) is a usage error stating the range."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not allowed: give a whole number from {self.min} to {self.max}", param, ctx)


def selection_options(func):
    func = click.option("--skip", multiple=True, metavar="ID", shell_complete=complete_patch_ids,
                        help="Leave this patch (or component) out.")(func)
    func = click.option("--only", multiple=True, metavar="ID", shell_complete=complete_patch_ids,
                        help="Only this patch id, or a component (comfyui, torch). Repeatable.")(func)
    return func


@cli.command()
@target_options
@selection_options
@click.option("--dry-run", is_flag=True, help="Plan and report; write nothing.")
@click.option("--fuzz", type=WholeNumber(0, 3), default=0, show_default=True,
              help="Context lines a hunk may ignore to find its place (fuzz can misplace hunks: off by default).")
def apply(invocation, only, skip, dry_run, fuzz):
    """Apply the catalog's patches that fit this install: all or nothing, backed up, journaled.

    Example: applier apply --target ComfyUI/ --only comfyui/max-resolution
    """
    from applier import operations
    found = invocation.target()
    catalog = invocation.catalog
    chosen = select_patches(catalog, tuple(only), tuple(skip))
    explicit = bool(only) and all(o not in COMPONENTS for o in only)
    with invocation.open_install(run=True, create=not dry_run) as install:
        result = operations.apply(install, chosen, fuzz=fuzz, dry_run=dry_run, explicit=explicit)
        if not dry_run:
            remember_interpreter(invocation, install)
    stale = [{"id": pid, "advice": advice} for pid, advice in result.stale]
    if invocation.as_json:
        out_json({"ok": not stale, "dry_run": dry_run, "recovered": result.recovered,
                  "python": str(found.python) if found.python else None,
                  "warnings": result.warnings, "stale": stale, "patches": [p.to_json() for p in result.plans]})
        if stale:
            sys.exit(EXIT_DRIFT)
        return
    say_interpreter(found)
    if result.recovered:
        click.echo(result.recovered)
    for plan in result.plans:
        verb = plan_verb(plan.action, dry_run)
        variant = f" (variant {plan.variant.name})" if plan.variant else ""
        click.echo(f"{plan.patch.id:32} {verb}{variant}: {plan.reason}")
        for change in plan.files:
            for h in change.plan.hunks:
                click.echo(f"    {change.relpath} hunk #{h.index}: {hunk_line(h, plan.action, dry_run)}")
    for warning in result.warnings:
        click.echo(f"warning: {warning}")
    if not dry_run and result.applied:
        click.echo(f"applied {len(result.applied)} patch(es); state in {found.state_dir}")
    elif not result.applied and not stale:
        click.echo("nothing to do")
    for item in stale:
        click.secho(f"drift: {item['advice']}", fg="yellow", err=True)
    if stale:
        sys.exit(EXIT_DRIFT)


def plan_verb(action, dry_run: bool) -> str:
    """What apply did (or, in a dry run, would do) with a patch."""
    from applier.catalog.planner import PlanAction
    match action:
        case PlanAction.APPLY:
            return "would apply" if dry_run else "applied"
        case PlanAction.ALREADY_APPLIED:
            return "already applied"
        case PlanAction.NOT_APPLICABLE:
            return "not applicable"
        case _:
            assert_never(action)


def hunk_line(h, action, dry_run: bool) -> str:
    """One hunk of the apply report, worded for what happened: a hunk found not applied before a successful run
    is now applied; in a dry run it would be."""
    from applier.catalog.planner import PlanAction
    from applier.diffengine import HunkState
    where = f"line {h.line}" if h.line else "new file"
    # the engine's note already words offsets and fuzz when it has something to say
    extra = f" ({h.note})" if h.note else "".join(
        [f", offset {h.offset:+d}" if h.offset else "", f", fuzz {h.fuzz}" if h.fuzz else ""])
    match h.state:
        case HunkState.NOT_APPLIED if action is PlanAction.APPLY:
            state = "would apply" if dry_run else "applied"
        case HunkState.APPLIED:
            state = "already applied"
        case HunkState.NOT_APPLIED | HunkState.CONFLICT:
            state = h.state.value
        case _:
            assert_never(h.state)
    return f"{state} at {where}{extra}"


@cli.command()
@target_options
@click.option("--only", multiple=True, metavar="ID", shell_complete=complete_patch_ids,
              help="Only this patch id, or a component. Repeatable.")
@click.option("--force", is_flag=True,
              help="Restore originals even of files edited since apply (their current bytes are saved first).")
@click.option("--dry-run", is_flag=True, help="Report what would be restored; write nothing.")
@click.option("--forget", is_flag=True,
              help="Drop the records and leave the files as they are (patches an update replaced for good).")
def revert(invocation, only, force, dry_run, forget):
    """Restore the exact original bytes of applied patches (latest first).

    Example: applier revert --target ComfyUI/
    """
    from applier import operations
    found = invocation.target()
    catalog = invocation.catalog
    check_known(catalog, tuple(only))
    with invocation.open_install(run=True, create=False) as install:
        if forget:   # its own operation, spelled as revert's adverb on the command line
            result = operations.forget(install, tuple(only), dry_run=dry_run)
        else:
            result = operations.revert(install, catalog, tuple(only), force=force, dry_run=dry_run)
        if not dry_run:
            remember_interpreter(invocation, install)
    if invocation.as_json:
        return out_json({"ok": True, "dry_run": dry_run, "recovered": result.recovered,
                         "python": str(found.python) if found.python else None,
                         "displaced": str(result.displaced) if result.displaced else None,
                         "patches": [{"id": r.id, "files": [vars(f) for f in r.files]} for r in result.reports]})
    say_interpreter(found)
    if result.recovered:
        click.echo(result.recovered)
    if not result.reports:
        click.echo("nothing to revert")
    for report in result.reports:
        click.echo(f"{report.id}: {'would revert' if dry_run else 'reverted'}")
        for f in report.files:
            action = dry_run_verb(f.action) if dry_run else f.action
            click.echo(f"    {action:16} {f.path}  {f.note}")
    if result.displaced:
        click.echo(f"current bytes of forced files saved in {result.displaced}")


@cli.command()
@target_options
@click.option("--only", multiple=True, metavar="ID", required=True, shell_complete=complete_patch_ids,
              help="The applied patch whose edited files to accept. Repeatable.")
def accept(invocation, only):
    """Take files edited by hand since apply as the patch's new patched state (its hunks must still be there).

    A later revert then reverses only the patch's hunks and keeps the edits. Example:
    applier accept --target ComfyUI/ --only comfyui/max-resolution
    """
    from applier import operations
    found = invocation.target()
    catalog = invocation.catalog
    check_known(catalog, tuple(only))
    with invocation.open_install(run=True, create=False) as install:
        reports = operations.accept(install, catalog, tuple(only))
    if invocation.as_json:
        return out_json({"ok": True, "patches": [{"id": r.id, "files": [vars(f) for f in r.files]}
                                                 for r in reports]})
    say_interpreter(found)
    for report in reports:
        click.echo(f"{report.id}: accepted")
        for f in report.files:
            click.echo(f"    {f.action:16} {f.path}  {f.note}")


@cli.command()
@target_options
def clean(invocation):
    """Remove .applier/ from a target where nothing is applied and no overlay is installed (displaced bytes stay).

    Example: applier clean --target ComfyUI/
    """
    from applier import operations
    found = invocation.target()
    with invocation.open_install(run=True, create=False) as install:
        result = operations.clean(install)
    if invocation.as_json:
        return out_json({"ok": True, "removed": result.removed, "existed": result.existed, "kept": result.kept})
    if not result.existed:
        click.echo(f"nothing to clean: {found.state_dir} does not exist")
    else:
        click.echo(f"removed {found.state_dir}" if result.removed else f"cleaned {found.state_dir}")
    for line in result.kept:
        click.echo(f"kept {line}")


def dry_run_verb(outcome) -> str:
    """What a revert would do to a file, said before it is done."""
    from applier.operations import FileOutcome
    match outcome:
        case FileOutcome.RESTORED:
            return "would restore"
        case FileOutcome.REVERSED_DIFF:
            return "would reverse"
        case FileOutcome.DELETED:
            return "would delete"
        case FileOutcome.FORCED:
            return "would force"
        case FileOutcome.FORGOTTEN:
            return "would forget"
        case FileOutcome.UNCHANGED | FileOutcome.LOST | FileOutcome.ACCEPTED:
            return outcome.value
        case _:
            assert_never(outcome)


# ------------------------------------------------------------------ explain

@cli.command()
@click.argument("patch_id", shell_complete=complete_patch_ids)
@patches_option()
@json_option
@pass_invocation
def explain(invocation, patch_id):
    """What a patch changes, whom it reaches, its measured effect, risks, and how to revert it.

    Example: applier explain torch/stream-priority
    """
    catalog = {p.id: p for p in invocation.catalog}
    if patch_id not in catalog:
        raise RefusedError(f"no patch {patch_id!r} in the catalog", hint=f"known: {', '.join(sorted(catalog))}")
    p = catalog[patch_id]
    revert_hint = f"applier revert --target <TARGET> --only {p.id}"
    if invocation.as_json:
        return out_json({"id": p.id, "title": p.title, "summary": p.summary, "reach": p.reach,
                         "measured": p.measured, "risks": p.risks, "revert": revert_hint,
                         "effect_probe": p.effect_probe, "default": p.default,
                         "variants": [{"name": v.name, "versions": str(v.versions), "tested": list(v.tested)}
                                      for v in p.variants]})
    click.echo(click.style(f"{p.id}: {p.title}", bold=True))
    for heading, text in (("What it changes", p.summary), ("Whom it reaches", p.reach),
                          ("Measured effect", p.measured or "not measured yet"), ("Risks", p.risks),
                          ("How to revert", revert_hint)):
        click.echo(f"\n{heading}:")
        for line in (text or "-").splitlines():
            click.echo(f"  {line}")
    click.echo("\nVariants:")
    for v in p.variants:
        tested = f"; checked on {', '.join(v.tested)}" if v.tested else ""
        click.echo(f"  {v.name}: {p.component} {v.versions}{tested}")
    if not p.default:
        click.echo(f"\nOpt-in: not applied by a plain `applier apply`; use --only {p.id}.")

