"""Ctrl-C and SIGTERM once a command runs: they unwind the command (KeyboardInterrupt, Terminated), a finalizer
cannot swallow them, and once the process is ending they change nothing. Also the quiet ends: a reader that went away
(a broken pipe) and an exit under PYTHONINSPECT."""
from __future__ import annotations

import os
import signal
import sys

from applier.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C (a BaseException, so no `except Exception` swallows it)."""


def raise_terminated(signum, frame):
    raise Terminated()


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
    """The process is ending (or saying why): a second Ctrl-C or SIGTERM changes nothing and prints nothing, also
    one that lands while the handlers are being switched off (it is raised there, and dropped: the switch is redone)."""
    while True:
        try:
            if hasattr(signal, "setitimer"):
                signal.setitimer(signal.ITIMER_REAL, 0)
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
            return
        except (KeyboardInterrupt, Terminated):
            continue


INTERRUPTED_HINT = "a run cut short is finished or rolled back by the next applier command on the install"


def stopped(exc: BaseException) -> tuple[str, int, str]:
    """(message, exit code, kind) of a Ctrl-C or SIGTERM that ended the command: one line."""
    what, code, kind = (("interrupted (Ctrl-C)", EXIT_INTERRUPTED, "Interrupted") if isinstance(exc, KeyboardInterrupt)
                        else ("terminated (SIGTERM)", EXIT_TERMINATED, "Terminated"))
    return f"{what}: {INTERRUPTED_HINT}", code, kind


def signal_inside(exc: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM an exception carries as its cause or context, None if none: Python wraps one raised
    inside some hooks (a RuntimeError "Error calling __set_name__" when it lands while a module defines a dataclass),
    and the command still ended by that signal."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


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


def quiet_broken_pipe() -> None:
    """The reader of our output went away (`applier list | head`): stop quietly, no traceback at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(EXIT_OK)
