"""The entry point of `applier` (setup.cfg's console script) and `python -m applier`: Ctrl-C and SIGTERM are answered
from its first statement. While the command's modules load (a tenth of a second or more, nothing written yet), either
ends the process at once with one line and exit 130 / 143; applier.cli.main then hands them to the command, which
unwinds (the next command finishes or rolls back a run cut short). A signal the process was started with ignored
(a background job's SIGINT) stays ignored.

Only the interpreter's own start-up (its site module, before any line of applier runs) is outside applier's reach."""
import os
import signal

EARLY_EXIT = {signal.SIGINT: (130, b"applier: interrupted (Ctrl-C) while starting; nothing was changed\n"),
              signal.SIGTERM: (143, b"applier: terminated (SIGTERM) while starting; nothing was changed\n")}


def early_exit(signum, frame):
    code, line = EARLY_EXIT[signum]
    try:
        os.write(2, line)
    finally:
        os._exit(code)


def entry():
    """Install early_exit for SIGINT and SIGTERM (unless ignored), then load and run the command line."""
    for signum in EARLY_EXIT:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, early_exit)
    from applier.cli import main
    main()


if __name__ == "__main__":
    entry()
