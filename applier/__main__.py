"""The entry point of `applier` (setup.cfg's console script) and `python -m applier`: Ctrl-C and SIGTERM are answered
from its first statement. While the command's modules load (a tenth of a second or more, nothing written yet), either
ends the process at once with one line and exit 130 / 143; applier.cli.main then hands them to the command, which
unwinds (the next command finishes or rolls back a run cut short). A signal the process was started with ignored
(a background job's SIGINT) stays ignored.

Only the interpreter's own start-up (its site module, runpy finding this file, before this module's first statement)
is outside applier's reach. The handlers are installed as this module is imported: it is the entry point only."""
from _signal import SIG_IGN, SIGINT, SIGTERM, getsignal, signal   # builtin: no import time before the handlers
from os import _exit, write

EARLY_EXIT = {SIGINT: (130, b"applier: interrupted (Ctrl-C) while starting; nothing was changed\n"),
              SIGTERM: (143, b"applier: terminated (SIGTERM) while starting; nothing was changed\n")}


def early_exit(signum, frame):
    code, line = EARLY_EXIT[signum]
    try:
        write(2, line)
    finally:
        _exit(code)


def answer_early() -> None:
    """early_exit for SIGINT and SIGTERM, unless the process was started with them ignored."""
    for signum in EARLY_EXIT:
        if getsignal(signum) is not SIG_IGN:
            signal(signum, early_exit)


answer_early()


def entry():
    """Load and run the command line (the signals are answered from the import of this module on)."""
    answer_early()
    from applier.cli import main
    main()


if __name__ == "__main__":
    entry()
