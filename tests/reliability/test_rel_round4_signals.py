"""Reliability round 4 (issue 49): Ctrl-C and SIGTERM at random moments of a command's life, start-up (its modules
loading) included, as a user's `python -m applier` process gets them. Held: exit 130 / 143 with one line on stderr and
no traceback, or the command's own ending when the signal came after its work; for a writing command the next command
then leaves a whole state, no journal pending, no temp file.

Before the first line of applier runs, the interpreter starts (its site module; runpy finding applier/__main__.py):
a signal there meets Python's own handling, which applier cannot reach. Those cases are counted apart
("before applier"), recognised by a traceback with no frame of applier (or a death by the signal with nothing
printed), and reported in the figures; every other case must hold."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from reltools import REPO, CATALOG_IDS, assert_clean, child_env, classify, cli, make_install, record_figure, strays

pytestmark = pytest.mark.slow

CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
SITE_WENT_ON = "Remainder of file ignored"     # site.addpackage's words after an exception in a .pth line
SAMPLES = int(os.environ.get("APPLIER_SIGNAL_SAMPLES", 24))


def spawn(args, env=None) -> subprocess.Popen:
    # SIGINT back to its default in the child: a suite started as a background job inherits it ignored
    return subprocess.Popen([sys.executable, "-m", "applier", *map(str, args)], cwd=REPO, env=child_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


MAIN = REPO / "applier" / "__main__.py"
# the line of applier/__main__.py that installs its handlers: a frame of that module above it is still start-up
ANSWERED_AT = next((n for n, line in enumerate(MAIN.read_text().splitlines(), 1) if line == "answer_early()"),
                   0)         # 0: an older applier, which installed none there (the figures' baseline)


def applier_frames(err: str) -> list[str]:
    """The frames of applier's own code in a traceback, but those of applier/__main__.py before its handlers are
    installed (the module's first statements, as the interpreter runs them) and of applier/__init__.py."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', err)
    return [f"{path}:{line}" for path, line, where in frames if f"{os.sep}applier{os.sep}" in path
            and not path.endswith(f"applier{os.sep}__init__.py")
            and not (path == str(MAIN) and where == "<module>" and int(line) < ANSWERED_AT)]


def judge(proc: subprocess.Popen, signum: int, normal: tuple[int, ...]) -> tuple[str, str]:
    """("held" | "before applier" | "failed", why) of a process that got signum."""
    _, err = proc.communicate(timeout=60)
    if proc.returncode in normal and "Traceback" not in err:
        return "held", "finished before the signal mattered"
    if proc.returncode == CODES[signum]:
        lines = [line for line in err.splitlines() if line.strip()]
        if "Traceback" in err or len(lines) != 1:
            return "failed", f"exit {proc.returncode} but stderr is {len(lines)} lines:\n{err[-800:]}"
        return "held", lines[0]
    # Python's site module, interrupted while it reads a .pth file (the editable install's), prints the traceback,
    # says "Remainder of file ignored" and runs the command all the same, to its own ending: before applier
    site_went_on = SITE_WENT_ON in err and proc.returncode in normal
    if not applier_frames(err) and (proc.returncode == -signum or site_went_on
                                    or ("Traceback" in err and proc.returncode in (1, -signum))):
        return "before applier", err.strip().splitlines()[-1] if err.strip() else f"killed by signal {signum}"
    last = err.strip().splitlines()[-1] if err.strip() else "nothing printed"
    return "failed", f"exit {proc.returncode}, {last!r}, applier frames {applier_frames(err)}:\n{err[-1200:]}"


def duration(args) -> float:
    start = time.monotonic()
    proc = spawn(args)
    proc.communicate(timeout=120)
    return time.monotonic() - start


def sample(command: str, args, signum: int, seed: int, after=None) -> list[str]:
    """SAMPLES runs of args, each sent signum at a random moment of its span (measured once, plus a tenth); after()
    -> (verdict, why) or None looks at what each run left. The failures, the figures recorded."""
    span = duration(args)
    if after is not None:
        after()
    rng = random.Random(seed + signum)
    counts = {"held": 0, "before applier": 0, "failed": 0}
    failures = []
    for delay in sorted(rng.uniform(0, span * 1.1) for _ in range(SAMPLES)):
        proc = spawn(args)
        time.sleep(delay)
        proc.send_signal(signum)
        verdict, why = judge(proc, signum, normal=(0,))
        verdict, why = (after() if after is not None else None) or (verdict, why)
        counts[verdict] += 1
        if verdict == "failed":
            failures.append(f"{delay * 1000:.0f} ms: {why}")
    record_figure("round4-signals", command=command, signal=signal.Signals(signum).name, tried=SAMPLES,
                  held=counts["held"], before_applier=counts["before applier"], span_ms=round(span * 1000))
    return failures


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_any_moment_of_a_reading_command(plain, signum):
    failures = sample("status", plain.args("status"), signum, 49)
    assert not failures, "\n".join(failures[:6])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_any_moment_of_apply_is_recovered(tmp_path, signum):
    inst = make_install(tmp_path / "t", layout="plain")

    def next_command():
        """The next command finishes or rolls back; then back to the original tree for the next case."""
        status = cli(*inst.args("status", "--json"))
        whole, tree = classify(inst)
        found = None
        if whole not in {("original", "absent"), ("patched", "absent")} or inst.journal.exists() \
                or strays(inst.root) or status.code != 0:
            found = ("failed", f"after the next command: {whole or tree}, {status}")
        elif whole[0] == "patched":
            states = {p["id"]: p["state"] for p in status.json()["patches"]}
            if any(states.get(i) != "applied" for i in CATALOG_IDS):
                found = ("failed", f"files patched, status says {states}")
        assert_clean(cli(*inst.args("revert")), allowed=(0,))
        return found

    failures = sample("apply", inst.args("apply"), signum, 490, after=next_command)
    assert not failures, "\n".join(failures[:6])


BANG_AT_IMPORT = """
import importlib.abc, os, signal, sys
class Bang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.{signal})
        return None
sys.meta_path.insert(0, Bang())
sys.argv = ["applier", "--version"]
import applier.__main__
applier.__main__.entry()
"""


@pytest.mark.parametrize("module", ["click", "applier.catalog", "applier.store.heldroot"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_modules_load_ends_at_once(module, signum):
    """Deterministically in the start-up window: the signal is sent as applier's modules load (a finder on
    sys.meta_path sends it when `module` is first imported); the process ends there, one line, its code."""
    code = BANG_AT_IMPORT.format(module=module, signal=signal.Signals(signum).name)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == CODES[signum], proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "nothing was changed" in proc.stderr
    assert proc.stdout == ""


IN_A_FINALIZER = """
import os, signal, sys
sys.argv = ["applier", "--version"]
import applier.__main__
from applier import cli
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.{signal})     # lands here, where Python would print it as ignored and go on
        for _ in range(100000):
            pass
run = cli.cli.main
def main(*args, **kwargs):
    Finalized()
    import time
    time.sleep(0.2)
    return run(*args, **kwargs)
cli.cli.main = main
cli.main()
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_that_lands_in_a_finalizer_still_ends_the_command(signum):
    proc = subprocess.run([sys.executable, "-c", IN_A_FINALIZER.format(signal=signal.Signals(signum).name)],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == CODES[signum], proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "ignored" not in proc.stderr, proc


def test_a_ctrl_c_that_python_wrapped_while_a_module_loads_is_still_130_and_one_line():
    """A SIGINT landing while a module defines a dataclass reaches the command as RuntimeError("Error calling
    __set_name__ ...") from KeyboardInterrupt (seen once in a random-signal run: exit 1, 'internal error'); the
    command ended by the signal all the same."""
    import click
    from click.testing import CliRunner

    from applier.cli.group import ApplierGroup

    @click.group(cls=ApplierGroup)
    def group():
        pass

    @group.command()
    def loads():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'x' in 'Y'") from exc

    result = CliRunner().invoke(group, ["loads"])
    assert result.exit_code == 130
    assert result.output.count("\n") == 1 and "interrupted (Ctrl-C)" in result.output
    assert "internal error" not in result.output
