"""Section 2, the randomised SIGKILL loop: apply, revert, overlay install and overlay uninstall, each killed with
SIGKILL at a random moment at least APPLIER_KILLS times (50 by default); after every kill one recovery command
(status, list, apply, revert, overlay list, overlay uninstall in turn) must leave every file all old or all new, the
state agreeing with the files, no temp file, no empty folder and no pending journal.

The killed run is a forked child of the test process running the CLI: killable like any process, and its whole
life is the command itself, so the random moments fall on the command's own steps rather than on interpreter
start-up. APPLIER_KILL_SEED makes a run repeatable (the seed is printed with any failure)."""
from __future__ import annotations

import os
import random
import signal
import statistics
import time

import pytest

from reltools import (INTERRUPTED, NEXT, cli, consistency_problems, effect_of, fork_cli, make_install, problems_of,
                      record_figure, removal_problems, restore, set_up, stash, strays, wait_exit)

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("APPLIER_KILLS", "50"))


def mid_write(inst) -> bool:
    """The kill caught the run between its first write in .applier/ and its last clean-up."""
    state = inst.root / ".applier"
    return inst.journal.exists() or (state / "journal-data").exists() or bool(strays(inst.root))


@pytest.mark.parametrize("command", list(INTERRUPTED))
def test_random_sigkills_leave_every_file_whole_and_nothing_stray(command, tmp_path):
    seed = int(os.environ.get("APPLIER_KILL_SEED") or random.SystemRandom().randrange(2 ** 32))
    rng = random.Random(seed)
    inst = make_install(tmp_path / "t")
    set_up(inst, command)
    saved = stash(inst.root, tmp_path / "saved")
    argv = inst.args(*INTERRUPTED[command][0])
    _, _, before, after = INTERRUPTED[command]

    # warm this process's imports (children inherit them), then learn how long an uninterrupted run lasts
    cli(*inst.args("apply", "--dry-run"))
    cli(*inst.args("overlay", "list"))
    spans = []
    for _ in range(3):
        restore(inst.root, saved)
        start = time.monotonic()
        code = wait_exit(fork_cli(*argv))
        spans.append(time.monotonic() - start)
        assert code == 0, f"an uninterrupted {command} failed with exit {code}"

    kills = in_write = attempts = 0
    failures = []
    next_names = list(NEXT)
    aim = 1.0   # shrinks while runs outpace the kill (a machine whose load changes under the loop), grows back
    while kills < KILLS and attempts < 10 * KILLS:
        attempts += 1
        restore(inst.root, saved)
        # half the moments anywhere in the run, half in its second half, where the writes are
        span = statistics.median(spans[-9:])   # runs that finished keep the aim on a busy machine
        delay = aim * span * (rng.uniform(0.0, 1.1) if attempts % 2 else rng.uniform(0.5, 1.05))
        start = time.monotonic()
        pid = fork_cli(*argv)
        code = wait_exit(pid, timeout=delay)
        if code is not None:
            spans.append(time.monotonic() - start)
            aim = max(0.2, aim * 0.85)
        else:
            aim = min(1.0, aim * 1.05)
            os.kill(pid, signal.SIGKILL)
            code = wait_exit(pid)
        killed = code == -signal.SIGKILL
        if killed:
            kills += 1
            in_write += mid_write(inst)
        elif code != 0:
            failures.append(f"run {attempts}: an uninterrupted {command} ended with exit {code}")
            continue
        next_name = next_names[attempts % len(next_names)]
        out = cli(*inst.args(*NEXT[next_name]))
        problems = [f"{next_name} {p}" for p in problems_of(out, allowed=(0,))]
        allowed = {effect_of(next_name, after)}
        if killed:
            allowed.add(effect_of(next_name, before))
        problems += consistency_problems(inst, allowed)
        if problems:
            failures.append(f"run {attempts} ({'killed' if killed else 'finished'} after {delay:.3f} s), then "
                            f"{next_name}: " + "; ".join(problems))
    problems = removal_problems(inst)           # and the last tree still goes back to the untouched one
    if problems:
        failures.append("revert + overlay uninstall after the last run: " + "; ".join(problems))
    record_figure("sigkill", command=command, runs=attempts, kills=kills, kills_mid_write=in_write,
                  failed=len(failures), seed=seed)
    assert not failures, (f"{len(failures)} of {attempts} runs of {command} broke something (seed {seed}, "
                          f"APPLIER_KILL_SEED={seed} repeats it):\n" + "\n".join(failures[:6]))
    assert kills >= KILLS, f"only {kills} of {attempts} runs were killed before they finished (seed {seed})"
