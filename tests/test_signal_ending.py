"""The process's ending ignores Ctrl-C and SIGTERM even when one lands while the handlers are being switched off
(reliability round 4 saw a SIGTERM raised inside that switch print a traceback after a finished command)."""
from __future__ import annotations

import signal

from applier.cli import signals


def test_a_signal_landing_while_the_handlers_are_switched_off_is_dropped(monkeypatch):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    real, landed = signal.signal, []

    def switch(signum, handler):
        if signum == signal.SIGTERM and not landed:      # SIGTERM arrives inside the second switch, once
            landed.append(signum)
            raise signals.Terminated()
        return real(signum, handler)
    monkeypatch.setattr(signal, "signal", switch)
    try:
        signals.ignore_signals()
        assert landed == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            real(signum, handler)
