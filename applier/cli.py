"""The command line: parse, call the core, print. The only module that prints."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from applier import __version__, settings
from applier.catalog import COMPONENTS, Patch, load_catalog, select_patches
from applier.errors import (EXIT_DRIFT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_VERIFY_FAILED,
                            ApplierError, RefusedError)
from applier.store.fsutil import io_failure
from applier.strenum import assert_never
from applier.target import Target

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C (a BaseException, so no `except Exception` swallows it)."""


def raise_terminated(signum, frame):
    raise Terminated()


def main() -> None:
    """The entry point of `applier` and `python -m applier`, reached through applier.__main__.entry (which ends the
    process at once on a signal while this module loads). From here SIGINT raises KeyboardInterrupt and SIGTERM
    Terminated, so that a command unwinds (ApplierGroup says so in one line, exit 130 / 143); once the process is
    ending, both are ignored. A signal the process was started with ignored stays ignored."""
    try:
        try:
            sys.unraisablehook = deliver_later
            for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, raise_terminated)):
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    signal.signal(signum, handler)
            cli.main(prog_name="applier")
        except BrokenPipeError:
            quiet_broken_pipe()
        except (KeyboardInterrupt, Terminated) as exc:     # between statements, before a command was entered
            sys.exit(say_stopped(exc, wants_json(sys.argv[1:])))
    except SystemExit as exc:
        ignore_signals()
        if sys.flags.inspect:
            exit_past_inspect(exc.code)
        raise


PENDING: list = []          # the Ctrl-C or SIGTERM deliver_later holds back for a moment


def deliver_later(unraisable) -> None:
    """sys.unraisablehook: a Ctrl-C or SIGTERM that landed in a finalizer (a __del__, a generator the collector
    closes), where Python would print it as ignored and go on, is raised again 10 ms later in the command's own code;
    anything else is reported as Python does."""
    exc = unraisable.exc_value
    if isinstance(exc, (KeyboardInterrupt, Terminated)) and hasattr(signal, "setitimer"):
        PENDING[:] = [type(exc)]
        signal.signal(signal.SIGALRM, raise_pending)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    sys.__unraisablehook__(unraisable)


def raise_pending(signum, frame):
    raise PENDING[0]()


def ignore_signals() -> None:
    """The process is ending (or saying why): a second Ctrl-C or SIGTERM changes nothing and prints nothing."""
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def stopped(exc: BaseException) -> tuple[str, int, str]:
    """(message, exit code, kind) of a Ctrl-C or SIGTERM that ended the command: one line."""
    what, code, kind = (("interrupted (Ctrl-C)", EXIT_INTERRUPTED, "Interrupted") if isinstance(exc, KeyboardInterrupt)
                        else ("terminated (SIGTERM)", EXIT_TERMINATED, "Terminated"))
    return f"{what}: {INTERRUPTED_HINT}", code, kind


def say_stopped(exc: BaseException, as_json: bool) -> int:
    """Say in one line (or one JSON error) that a signal ended the command; its exit code."""
    ignore_signals()
    message, code, kind = stopped(exc)
    if as_json:
        out_json({"ok": False, "error": {"kind": kind, "message": message, "hint": None, "exit_code": code}})
    else:
        click.echo(f"error: {message}", err=True)
    return code


def wants_json(argv) -> bool:
    """--json among the arguments (before a `--`): errors Click finds before any command runs are JSON too."""
    argv = list(argv)
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def exit_past_inspect(code) -> None:
    """Under PYTHONINSPECT (or -i) Python answers our SystemExit with a traceback and exit 1, and would open a >>>
    prompt on a terminal: end as a plain exit does (exit handlers run, output flushed), without either."""
    import atexit
    if code is not None and not isinstance(code, int):   # SystemExit("message"): printed, exit 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


UNFORESEEN_IO_HINT = ("applier stopped there; a run it had started is finished or rolled back by the next applier "
                      "command on the install, once the cause (permissions, free space) is fixed")
INTERRUPTED_HINT = "a run cut short is finished or rolled back by the next applier command on the install"


def quiet_broken_pipe() -> None:
    """The reader of our output went away (`applier list | head`): stop quietly, no traceback at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(EXIT_OK)


class ApplierGroup(click.Group):
    """Turns ApplierError into a message and its stable exit code; any other exception into exit 1; a usage error
    into Click's message, or with --json the JSON error README promises (exit 2); Ctrl-C and SIGTERM into one line
    and 130 / 143, wherever they land (Click's own word for a Ctrl-C, Abort and exit 1, is not used)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = self.argv = list(sys.argv[1:] if args is None else args)
        try:
            result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else EXIT_OK
        except click.exceptions.Abort as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, KeyboardInterrupt):
                code = say_stopped(cause, wants_json(argv))
            else:           # end of input at a prompt: as Click says it
                click.echo("Aborted!", err=True)
                code = EXIT_INTERNAL
        except click.ClickException as exc:
            code = say_usage_error(exc, wants_json(argv))
        except (KeyboardInterrupt, Terminated) as exc:
            code = say_stopped(exc, wants_json(argv))
        if not standalone_mode:
            return code
        sys.exit(code)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ApplierError as exc:
            emit_error(ctx, exc.message, exc.hint, exc.exit_code, type(exc).__name__)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except (KeyboardInterrupt, Terminated) as exc:
            ignore_signals()
            message, code, kind = stopped(exc)
            emit_error(ctx, message, None, code, kind)
        except BrokenPipeError:
            quiet_broken_pipe()
        except OSError as exc:  # the file system refused something no check foresaw: still a message, exit 8
            failure = io_failure(exc, Path(exc.filename) if exc.filename else Path("a file"), "access",
                                 hint=UNFORESEEN_IO_HINT)
            emit_error(ctx, failure.message, failure.hint, failure.exit_code, "IOFailure")
        except Exception as exc:  # a bug: say so plainly, keep the traceback for a report
            import traceback
            traceback.print_exc()
            emit_error(ctx, f"internal error: {type(exc).__name__}: {exc}", "please report this with the "
                       "traceback above", EXIT_INTERNAL, "InternalError")


def say_usage_error(exc: click.ClickException, as_json: bool) -> int:
    """A usage error as Click prints it, or with --json as README's JSON error (kind UsageError); its exit code."""
    if not as_json:
        exc.show()
        return exc.exit_code
    context = getattr(exc, "ctx", None)
    hint = f"`{context.command_path} --help` lists its options" if context is not None else "`applier --help`"
    out_json({"ok": False, "error": {"kind": "UsageError", "message": exc.format_message(), "hint": hint,
                                     "exit_code": exc.exit_code}})
    return exc.exit_code


def emit_error(ctx, message: str, hint: str | None, code: int, kind: str):
    invocation = ctx.find_object(Invocation)
    # --json as parsed, or as typed: an error before the command's options are parsed (a bad APPLIER_* value)
    if (invocation is not None and invocation.as_json) or wants_json(getattr(ctx.find_root().command, "argv", ())):
        click.echo(json.dumps({"ok": False, "error": {"kind": kind, "message": message, "hint": hint,
                                                       "exit_code": code}}, indent=2))
    else:
        click.secho(f"error: {message}", fg="red", err=True)
        if hint:
            click.echo(f"  hint: {hint}", err=True)
    ctx.exit(code)


class Invocation:
    """What one command works on, each resolved once, when first asked: the install (--target, --python), the
    catalog (--patches), and whether output is JSON (--json). The group makes it the context's object; the options
    stay on each command and fill it (target_options, patches_option, json_option), and the command receives it as
    its first argument (pass_invocation, Click's make_pass_decorator)."""

    def __init__(self) -> None:
        self.as_json = False
        self.target_path: Path | None = None
        self.python: Path | None = None
        self.patches_dir: Path | None = None
        self._found: dict[bool, Target] = {}
        self._catalog: list[Patch] | None = None

    def target(self, *, gpu: bool = False) -> Target:
        """The target as detected, with the interpreter --python names, else the one recorded for this install (a
        conda env, a shared venv: given once with --python, reused by every later command), else the one found by
        layout. gpu: also look for GPUs (nvidia-smi)."""
        if gpu not in self._found:
            from applier.detect import detect
            self._found[gpu] = detect(self.target_path, python=self.python, gpu=gpu)
        return self._found[gpu]

    @property
    def catalog(self) -> list[Patch]:
        """The catalog --patches names, else the packaged one."""
        if self._catalog is None:
            self._catalog = load_catalog(self.patches_dir)
        return self._catalog

    def open_install(self, overlay=None, *, run: bool = False, create: bool = True):
        """The install opened once for this command (a context manager): its held roots, state store, lock and
        journal, confined to what the catalog (and the overlay pack, overlay's folders) may touch. run: a command
        that changes it, whose lock is taken and interrupted run finished on entry (create=False: only where
        .applier/ exists)."""
        from applier.catalog.allowlist import install_for
        return install_for(self.target(), self.catalog, overlay, run=run, create=create)


pass_invocation = click.make_pass_decorator(Invocation, ensure=True)


def into_invocation(ctx, param, value):
    """An option's value goes to the command's Invocation (the attribute named as the option's name)."""
    setattr(ctx.ensure_object(Invocation), param.name, value)
    return value


def remember_json(ctx, param, value):
    """Errors raised below a command are printed by the group: it learns about --json through the Invocation."""
    if value:
        ctx.ensure_object(Invocation).as_json = True
    return value


def json_option(func):
    return click.option("--json", "as_json", is_flag=True, callback=remember_json, expose_value=False,
                        help="Machine-readable output.")(func)


def patches_option(help_text: str | None = None):
    return click.option("--patches", "patches_dir", type=click.Path(file_okay=False, path_type=Path), help=help_text,
                        callback=into_invocation, expose_value=False)


def target_options(func):
    """--target, --python, --patches, --json: shared by every command that looks at a target, which receives them
    as an Invocation (its first argument) that detects the target and loads the catalog once, when first asked."""
    func = pass_invocation(func)
    func = json_option(func)
    func = patches_option("Another catalog folder (default: the packaged patches/).")(func)
    func = click.option("--python", "python", type=click.Path(path_type=Path), callback=into_invocation,
                        expose_value=False, help="The target's interpreter (overrides detection).")(func)
    func = click.option("--target", "-t", "target_path", required=True, type=click.Path(path_type=Path),
                        callback=into_invocation, expose_value=False,
                        help="ComfyUI folder, portable install, or Python env.")(func)
    return func


def remember_interpreter(invocation: Invocation, install) -> None:
    """After a command that wrote with --python: record that interpreter for this install's later commands."""
    from applier.store.state import read_interpreter
    found = install.target
    if invocation.python is None or found.python is None:
        return
    chosen = Path(os.path.abspath(found.python))
    if read_interpreter(found.state_dir) == chosen:   # already recorded: no lock, no write
        return
    install.record_interpreter(chosen)


def say_interpreter(found) -> None:
    """Which interpreter a command used, when it was not simply the one in the install's own folder."""
    if found.python is not None and found.python_source in ("--python", "state"):
        how = "recorded for this install" if found.python_source == "state" else "--python"
        click.echo(f"python: {found.python} ({how})")


def out_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group(cls=ApplierGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="applier")
@click.pass_context
def cli(ctx):
    """Managed, reversible, verifiable patches and kernel overlays for ComfyUI and PyTorch installs.

    \b
    applier detect --target ComfyUI/      what is installed
    applier apply  --target ComfyUI/      all-or-nothing, backed up, journaled
    applier verify --target ComfyUI/      prove the effect
    applier revert --target ComfyUI/      byte-identical restore
    """
    ctx.ensure_object(Invocation)
    settings.check_environment()    # a bad APPLIER_* value is exit 2 before any command starts
    if settings.no_color():
        ctx.color = False


# ------------------------------------------------------------------ detect

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


# ------------------------------------------------------------------ verify

def _verify_size(text):
    """--size WxH as (width, height); a usage error (exit 2) otherwise."""
    if text is None:
        return None
    from applier import budget
    try:
        return budget.parse_size(text)
    except ValueError as exc:
        low, high = budget.SIZE_RANGE
        message = str(exc) if f"{low} to {high}" in str(exc) else f"{exc}; each side from {low} to {high} pixels"
        raise click.BadParameter(message, param_hint="--size") from None


TIMEOUT_RANGE_S = (1.0, 24 * 3600.0)    # a check's subprocess: a second to a day (kernel parity takes minutes)


def _verify_timeout(value):
    """--timeout within TIMEOUT_RANGE_S; nan, inf, zero and negatives are a usage error (exit 2) before any work."""
    low, high = TIMEOUT_RANGE_S
    if value is not None and not low <= value <= high:     # False for nan as well
        raise click.BadParameter(f"{value} is not a timeout applier can use: give seconds from {low:g} to "
                                 f"{high:g} (a day)")
    return value


@cli.command()
@target_options
@click.option("--only", multiple=True, metavar="CHECK", help="Only this check. Repeatable.")
@click.option("--kernels/--no-kernels", default=False, show_default=True,
              help="Run kernel parity of installed overlays.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--real-import", is_flag=True, help="Import the target's ComfyUI nodes in its own interpreter.")
@click.option("--timeout", type=float, default=None, callback=lambda _c, _p, v: _verify_timeout(v),
              help=f"Seconds per check subprocess, {TIMEOUT_RANGE_S[0]:g} to {TIMEOUT_RANGE_S[1]:g} "
                   "[default: 180; kernel-parity 900].")
@click.option("--size", metavar="WxH", default=None, callback=lambda _c, _p, v: _verify_size(v),
              help="Also run the reach check: every cap below this canvas (e.g. 32768x18432).")
@click.option("--keep-pythonpath", is_flag=True,
              help="Pass PYTHONPATH on to the checks that run in the target's interpreter (isolated, without it, "
                   "by default).")
def verify(invocation, only, kernels, device, real_import, timeout, size, keep_pythonpath):
    """Prove the effect: MAX_RESOLUTION as the server sees it, each patch's behaviour, kernel parity.

    A line per check on stderr as it starts and ends. The checks that need torch run in the target's interpreter
    isolated (python -I), without PYTHONPATH, as ComfyUI started from its own folder would; --keep-pythonpath
    passes it on. Exit 6 when a check FAILs or every check SKIPs (SKIP is never PASS).
    Example: applier verify --target ComfyUI/
    """
    from applier.catalog.allowlist import store_for
    from applier.resources import load_verify
    from applier.store.journal import recover_if_pending
    verify_pkg = load_verify()
    found = invocation.target()
    catalog = invocation.catalog
    store = store_for(found, catalog)
    recover_if_pending(store)   # an interrupted apply/revert is finished before anything is judged
    state = store.load()
    tty = sys.stderr.isatty()
    shown = tty or not invocation.as_json      # --json's reader gets the document alone, unless at a terminal
    if shown and os.environ.get("PYTHONPATH") and not keep_pythonpath:
        click.echo(f"note: {verify_pkg.KEEP_PYTHONPATH_HINT}", err=True)

    def progress(step):
        """A line per check on stderr: "[3/12] name ..." as it starts, its outcome and time as it ends (on a
        terminal the end overwrites the start)."""
        if not shown:
            return
        head = f"[{step.index}/{step.total}] {step.name}"
        if step.result is None:
            click.echo(f"{head} ...", err=True, nl=not tty)
        else:
            outcome = getattr(step.result.outcome, "value", step.result.outcome)
            click.echo(("\r\033[K" if tty else "") + f"{head}: {outcome} in {step.result.duration_s:.1f} s",
                       err=True)

    limits = {} if timeout is None else {"timeout": timeout, "kernel_timeout": timeout}
    options = verify_pkg.VerifyOptions(target=found, catalog=catalog, state=state, device=device, kernels=kernels,
                                       real_import=real_import, only=tuple(only), progress=progress, size=size,
                                       keep_pythonpath=keep_pythonpath, **limits)
    results = verify_pkg.run_verify(options)
    ok = verify_pkg.overall_ok(results)
    if invocation.as_json:
        out_json(verify_pkg.results_to_json(results, target=found))
    else:
        colors = {"PASS": "green", "FAIL": "red", "WARN": "yellow", "SKIP": "cyan"}
        width = max((len(r.name) for r in results), default=10)
        for r in results:
            outcome = r.outcome.value if hasattr(r.outcome, "value") else str(r.outcome)
            click.echo(f"{r.name.ljust(width)}  " + click.style(f"{outcome:4}", fg=colors.get(outcome))
                       + f"  {r.reason}")
        counts = {}
        for r in results:
            key = r.outcome.value if hasattr(r.outcome, "value") else str(r.outcome)
            counts[key] = counts.get(key, 0) + 1
        click.echo(", ".join(f"{counts.get(k, 0)} {k}" for k in ("PASS", "FAIL", "WARN", "SKIP")))
        if verify_pkg.nothing_verified(results):
            click.echo("nothing was verified: every check SKIPped (the reasons above say what is missing)")
    if not ok:
        sys.exit(EXIT_VERIFY_FAILED)


# ------------------------------------------------------------------ overlays

@cli.group()
def overlay():
    """Install, list and uninstall operator overlays (fused Triton kernels + a ComfyUI node)."""


@overlay.command("install")
@target_options
def overlay_install(invocation):
    """Install the overlay pack into the target environment's own site-packages and custom_nodes/ (a manifest
    tracks every file); never into a parent environment that --system-site-packages shows it.

    Example: applier overlay install --target ComfyUI/
    """
    from applier.pack import overlays
    found = invocation.target()
    meta = overlays.read_pack(overlays.OVERLAYS_DIR)
    with invocation.open_install(overlays.prefixes(found, meta), run=True) as install:
        result = overlays.install(install, meta=meta)
        remember_interpreter(invocation, install)
    if invocation.as_json:
        return out_json({"ok": True, "python": str(found.python) if found.python else None, **result})
    say_interpreter(found)
    click.echo(f"installed overlay pack {result['pack']} {result['version']}: {len(result['files'])} files")
    for where in result["roots"]:
        click.echo(f"    {where}")


@overlay.command("uninstall")
@target_options
@click.option("--force", is_flag=True, help="Also remove files edited since install (saved aside first).")
def overlay_uninstall(invocation, force):
    """Remove exactly the files the overlay install recorded.

    Example: applier overlay uninstall --target ComfyUI/
    """
    from applier.pack import overlays
    found = invocation.target()
    with invocation.open_install(overlays.prefixes(found), run=True, create=False) as install:
        result = overlays.uninstall(install, force=force)
    if invocation.as_json:
        return out_json({"ok": True, "python": str(found.python) if found.python else None, **result})
    say_interpreter(found)
    click.echo(f"removed {len(result['removed'])} files" if result["removed"] else "no overlay installed")


@overlay.command("list")
@target_options
def overlay_list(invocation):
    """Show the installed overlay pack and whether its files are intact.

    Example: applier overlay list --target ComfyUI/
    """
    from applier.pack import overlays
    found = invocation.target()
    result = overlays.listing(found, catalog=invocation.catalog)
    if invocation.as_json:
        return out_json({"python": str(found.python) if found.python else None, **result})
    say_interpreter(found)
    if result.get("recovered"):
        click.echo(result["recovered"])
    if not result["installed"]:
        from applier.pack.node_pack import Installer
        from applier.status import node_pack_installs, node_pack_lines
        by_hand = [i for i in node_pack_installs(found) if i["installed_by"] is not Installer.APPLIER]
        click.echo("no overlay installed by applier")
        for line in node_pack_lines(by_hand) if by_hand else []:
            click.echo(line)
        return
    click.echo(f"{result['pack']} {result['version']}: {result['intact']} intact, {result['modified']} modified, "
               f"{result['missing']} missing")


def _registry_field(param, value):
    """--publisher / --repository as the Comfy Registry accepts them; a usage error (exit 2) before any write."""
    from applier.pack.node_pack import registry_field_problems
    problem = registry_field_problems(**{param.name: value}).get(param.name)
    if problem:
        raise click.BadParameter(problem)
    return value


@overlay.command("export")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--publisher", metavar="ID", callback=lambda _c, p, v: _registry_field(p, v),
              help="Your Comfy Registry publisher id (fills [tool.comfy] PublisherId).")
@click.option("--repository", metavar="URL", callback=lambda _c, p, v: _registry_field(p, v),
              help="The pack's repository (fills [project.urls] Repository).")
@json_option
@pass_invocation
def overlay_export(invocation, folder, publisher, repository):
    """Write the node pack as one self-contained folder to install the ComfyUI way (ComfyUI-Manager's git URL,
    `comfy node install` once published): push it as a repository's root, or copy it into custom_nodes/.

    Example: applier overlay export dist/fused-dit --publisher me --repository https://github.com/me/fused-dit
    """
    from applier.pack.node_pack import export
    result = export(folder, publisher=publisher, repository=repository)
    if invocation.as_json:
        return out_json({"ok": True, **result})
    if result["recovered"]:
        click.echo(f"removed {result['recovered']}, an interrupted export's partial copy")
    click.echo(f"wrote {result['name']} {result['version']} ({len(result['files'])} files) to {result['folder']}")
    for rel in result["removed"]:
        click.echo(f"    removed {rel} (no longer in the pack)")


@overlay.command("check")
@target_options
@click.option("--verbose", "-v", is_flag=True,
              help="Under each line, the pack's own names for it and the long reason (the code that differs).")
def overlay_check(invocation, verbose):
    """Per model family and op family, what the node would run on this ComfyUI, or why it stays stock.

    Reads the target's ComfyUI files (no torch, no GPU): one line per op family, attention included, in words of
    ComfyUI and PyTorch; the pack's own names and the long reasons with --verbose or --json. Exit 0 with the report,
    whatever stays stock; 9 when the target holds no ComfyUI code; 3 when the overlay pack's variants.json is
    unreadable.
    Example: applier overlay check --target ComfyUI/
    """
    from applier.errors import BadTargetError
    from applier.pack.check import check_tree, report_lines
    found = invocation.target()
    if found.comfyui_root is None:
        raise BadTargetError(f"{invocation.target_path} has no ComfyUI folder",
                             hint="point --target at the ComfyUI folder")
    from applier.status import node_pack_installs, node_pack_lines, parts_line
    report = check_tree(found.comfyui_root, found.comfyui_version, node_pack=node_pack_installs(found))
    if invocation.as_json:
        return out_json({**report, "site_packages": str(found.site_packages) if found.site_packages else None,
                         "purelib": str(found.purelib) if found.purelib else None})
    click.echo(f"ComfyUI {found.comfyui_version or 'version unknown'} at {found.comfyui_root}")
    for line in node_pack_lines(report["node_pack"]) + [report["node_pack_note"] or "", parts_line(found) or ""]:
        if line:
            click.echo(line)
    for line in report_lines(report, verbose=verbose):
        click.echo(line)


# ------------------------------------------------------------------ budget

def _budget_option(read):
    """A Click callback: the value read by `read(inputs, value)` over applier/budget/inputs.py, whose readers state
    the range they hold; outside it a usage error (exit 2) before any work. None passes (the default applies)."""
    def callback(_ctx, _param, value):
        if value is None:
            return None
        from applier.budget import inputs
        try:
            return read(inputs, value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return callback


@cli.command("budget")
@target_options
@click.option("--model", "model_name", required=True, metavar="MODEL",
              help="Model family: flux-dev, flux2-dev, wan-14b, qwen-image, sdxl.")
@click.option("--size", required=True, metavar="WxH", callback=_budget_option(lambda i, v: i.parse_size(v)),
              help="Canvas width x height in pixels, e.g. 32768x18432; one number is a square. Each side 16-65536.")
@click.option("--frames", type=int,
              callback=_budget_option(lambda i, v: i.in_range(v, i.FRAMES_RANGE, "a frame count")),
              help="Frames of a video model, 1-16384 [default: the model's].")
@click.option("--gpu", "gpu_name", metavar="NAME", help="A GPU of the budget's table [default: the detected one].")
@click.option("--steps", type=int,
              callback=_budget_option(lambda i, v: i.in_range(v, i.STEPS_RANGE, "a step count")),
              help="Sampling steps, 1-10000 [default: the model's reference sampler; a tiled route the template's].")
@click.option("--cfg", type=float,
              callback=_budget_option(lambda i, v: i.in_range(v, i.CFG_RANGE, "a CFG scale (KSampler's range)")),
              help="CFG scale, 0-100: 1.0 runs one forward per step, any other two [default: the model's].")
@click.option("--within", default="1h", show_default=True, metavar="DURATION",
              callback=_budget_option(lambda i, v: i.parse_duration(v)),
              help="The time a generation may take (1h, 90m, 2h30m, seconds; 1 s to 1000 h): native only if it "
                   "finishes within it.")
@click.option("--verbose", "-v", is_flag=True, help="Every config, every node cap and every note.")
def budget_cmd(invocation, model_name, size, frames, gpu_name, steps, cfg, within, verbose):
    """What a canvas costs: the verdict and why, then time per step and generation, memory, the target's caps.

    Reads files and nvidia-smi only, never torch. Exit 2 for a value outside its range, 3 for a model or GPU the
    table does not know. Example: applier budget --target ComfyUI/ --model flux-dev --size 32768x18432 --gpu rtx-4090
    """
    from applier import budget
    from applier.budget.caps import read_target_caps
    from applier.budget.data import load_budget_data
    from applier.budget.template import template_for
    width, height = size
    data = load_budget_data()
    model = budget.find_model(data, model_name)
    if frames is not None and not model.video:
        raise click.BadParameter(f"{model.name} makes images; --frames is for video models", param_hint="--frames")
    found = invocation.target(gpu=gpu_name is None)
    gpu, how, memory_mib = budget.choose_gpu(data, gpu_name, [(g.name, g.memory_mib) for g in found.gpus],
                                             found.gpu_problem)
    template = None if steps else template_for(data, model)
    request = budget.Request(
        model, gpu, budget.Canvas(width, height, frames or model.frames), steps or model.steps,
        model.cfg_forwards if cfg is None else (1 if cfg == 1.0 else 2), within, found.comfyui_version,
        sys.platform.startswith("win"), memory_mib, how, template.steps if template else None,
        "--steps" if steps else "the model's reference sampler", template.words() if template else "")
    caps = read_target_caps(found, max(width, height), data.measured.pillow_max_image_pixels)
    report = budget.plan_budget(data, request, caps)
    if invocation.as_json:
        return out_json({"target": str(found.root), **report.as_json()})
    for line in budget.report_lines(report, verbose):
        click.echo(line)


# ------------------------------------------------------------------ catalog maintenance

@cli.group()
def catalog():
    """Maintainer commands: check coverage against upstream files, add variants."""


@catalog.command("check")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Upstream cache: <cache>/<component>/<version>/<files> (scripts/fetch_*_upstream.py fill it).")
@patches_option()
@json_option
@pass_invocation
def catalog_check(invocation, cache):
    """Every variant must apply and revert cleanly on every upstream version it claims, and no other.

    Example: applier catalog check --cache DIR
    """
    from dataclasses import asdict

    from applier.catalog.check import check_catalog
    report = check_catalog(invocation.catalog, cache)
    if invocation.as_json:
        out_json({"ok": report.ok, "cache": str(report.cache_root), "problems": report.problems,
                  "warnings": report.warnings, "rows": [asdict(row) for row in report.rows]})
    else:
        for row in report.rows:
            counts: dict[str, int] = {}
            for cell in row.cells:
                counts[cell.state.value] = counts.get(cell.state.value, 0) + 1
            summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            click.echo(f"{row.patch_id:32} {row.variant:14} {row.versions:22} {summary}")
        for warning in report.warnings:
            click.echo(f"warning: {warning}")
        for problem in report.problems:
            click.echo(f"problem: {problem}")
        click.echo("catalog check: " + ("ok" if report.ok else f"{len(report.problems)} problem(s)"))
    if not report.ok:
        sys.exit(3)


@catalog.command("refresh")
@click.argument("patch_id")
@click.option("--upstream", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The new release's pristine file.")
@click.option("--edited", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The same file with the patch's change made by hand.")
@click.option("--path", "relpath", required=True, help="The file's path inside the component root.")
@click.option("--versions", required=True, help='Specifier the new variant covers, e.g. ">=2.16,<2.17".')
@click.option("--name", "variant_name", required=True, help="The new variant's name, e.g. 2.16.")
@patches_option()
@pass_invocation
def catalog_refresh(invocation, patch_id, upstream, edited, relpath, versions, variant_name):
    """Build a new variant's diff from an edited copy of a new upstream file and register it.

    Example: applier catalog refresh torch/stream-priority --upstream new/streams.py --edited mine/streams.py
    --path torch/cuda/streams.py --versions ">=2.16,<2.17" --name 2.16
    """
    from applier.catalog.authoring import add_variant
    from applier.resources import RESOURCE_ORIGIN
    if invocation.patches_dir is None and RESOURCE_ORIGIN == "installed":
        raise RefusedError("catalog refresh writes into the catalog, and this applier's is the copy inside its "
                           "installed package", hint="run it from a checkout, or pass --patches DIR")
    catalog = {p.id: p for p in invocation.catalog}
    if patch_id not in catalog:
        raise RefusedError(f"no patch {patch_id!r} in the catalog", hint=f"known: {', '.join(sorted(catalog))}")
    diff_path = add_variant(catalog[patch_id], upstream.read_bytes(), edited.read_bytes(), relpath, versions,
                            variant_name)
    click.echo(f"wrote {diff_path} and its [[variant]] entry in {catalog[patch_id].folder / 'patch.toml'}")


if __name__ == "__main__":  # pragma: no cover
    main()
