"""The command line's core: the entry point (main), the group that turns every failure into a message and its exit
code (ApplierGroup), and the Invocation each command receives with the options that fill it. The commands live in
their family's module beside this one (patches, verify, overlay, budget, catalog)."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from applier import __version__, settings
from applier.catalog import Patch, load_catalog
from applier.cli.signals import (Terminated, deliver_later, exit_past_inspect, ignore_signals, quiet_broken_pipe,
                                 raise_terminated, signal_inside, stopped, wants_json)
from applier.errors import EXIT_INTERNAL, EXIT_OK, ApplierError
from applier.store.fsutil import io_failure
from applier.target import Target

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


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


def say_stopped(exc: BaseException, as_json: bool) -> int:
    """Say in one line (or one JSON error) that a signal ended the command; its exit code."""
    ignore_signals()
    message, code, kind = stopped(exc)
    if as_json:
        out_json({"ok": False, "error": {"kind": kind, "message": message, "hint": None, "exit_code": code}})
    else:
        click.echo(f"error: {message}", err=True)
    return code


UNFORESEEN_IO_HINT = ("applier stopped there; a run it had started is finished or rolled back by the next applier "
                      "command on the install, once the cause (permissions, free space) is fixed")


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
            self.say_stopped(ctx, exc)
        except BrokenPipeError:
            quiet_broken_pipe()
        except OSError as exc:  # the file system refused something no check foresaw: still a message, exit 8
            failure = io_failure(exc, Path(exc.filename) if exc.filename else Path("a file"), "access",
                                 hint=UNFORESEEN_IO_HINT)
            emit_error(ctx, failure.message, failure.hint, failure.exit_code, "IOFailure")
        except Exception as exc:  # a bug: say so plainly, keep the traceback for a report
            interrupt = signal_inside(exc)
            if interrupt is not None:   # a Ctrl-C or SIGTERM that Python wrapped: the signal ended the command
                return self.say_stopped(ctx, interrupt)
            import traceback
            traceback.print_exc()
            emit_error(ctx, f"internal error: {type(exc).__name__}: {exc}", "please report this with the "
                       "traceback above", EXIT_INTERNAL, "InternalError")

    @staticmethod
    def say_stopped(ctx, exc: BaseException) -> None:
        ignore_signals()
        message, code, kind = stopped(exc)
        emit_error(ctx, message, None, code, kind)


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

