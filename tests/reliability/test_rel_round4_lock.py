"""Reliability round 4 (issue 49): the lock file names its holder (pid, host, command, since when) while a run holds
it, and is emptied when the run ends; a run that waits in vain says who holds the lock (exit 4), and says so when that
process no longer runs (the lock left to a process it started: stale). A lock file with crafted content is shown
only as plain bounded values, or not at all."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from reltools import REPO, assert_clean, child_env, cli, record_figure

pytestmark = pytest.mark.slow

HOLD = """
import os, sys, time
from pathlib import Path
from applier.store.confine import Confinement
from applier.store.state import StateStore
sys.argv = ["applier", "apply", "--target", {target!r}]
d = Path({state!r})
with StateStore(d, Confinement({{}}, d)).locked():
    if {stale}:
        if os.fork() == 0:          # the child keeps the flock (one open file); the holder itself goes
            print("held", flush=True)
            time.sleep(60)
            os._exit(0)
        time.sleep(0.5)
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
"""


def hold(inst, *, stale: bool = False) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD.format(target=str(inst.root), stale=stale,
                                                                  state=str(inst.root / ".applier"))],
                              stdout=subprocess.PIPE, text=True, cwd=REPO, env=child_env(), start_new_session=True)
    assert holder.stdout.readline().strip() == "held"
    if stale:
        holder.wait(timeout=30)
    return holder


def release(holder: subprocess.Popen) -> None:
    os.killpg(holder.pid, signal.SIGKILL)       # the holder and, for the stale case, the child it left
    holder.wait()


def test_the_locked_message_names_the_holder(applied):
    holder = hold(applied)
    try:
        record = json.loads((applied.root / ".applier" / "lock").read_text())
        assert record["pid"] == holder.pid and record["host"] == socket.gethostname()
        assert record["command"] == f"applier apply --target {applied.root}" and record["since"].endswith("Z")
        out = cli(*applied.args("revert"), env={"APPLIER_LOCK_TIMEOUT": "0.3"})
        assert out.code == 4, out
        assert f"pid {holder.pid} on {socket.gethostname()}" in out.stderr
        assert f"`applier apply --target {applied.root}`" in out.stderr and f"since {record['since']}" in out.stderr
        assert "no longer runs" not in out.stderr and f"kill {holder.pid}" in out.stderr
    finally:
        release(holder)
    assert_clean(cli(*applied.args("revert")), allowed=(0,))
    assert (applied.root / ".applier" / "lock").read_bytes() == b"", "the lock file still names a holder"
    record_figure("round4-lock", case="holder named", tried=1, held=1)


def test_a_holder_that_no_longer_runs_is_said_to_be_stale(applied):
    holder = hold(applied, stale=True)
    try:
        out = cli(*applied.args("status"), env={"APPLIER_LOCK_TIMEOUT": "0.3"})
        out = out if out.code == 4 else cli(*applied.args("revert"), env={"APPLIER_LOCK_TIMEOUT": "0.3"})
        assert out.code == 4, out
        assert f"pid {holder.pid}" in out.stderr and "no longer runs (stale)" in out.stderr, out
        assert "fuser" in out.stderr
    finally:
        release(holder)
    assert_clean(cli(*applied.args("revert")), allowed=(0,))
    record_figure("round4-lock", case="stale holder", tried=1, held=1)


@pytest.mark.parametrize("content", [b"", b"not json", b'{"pid": "1"}', b'{"pid": -4}', b"[1, 2]",
                                     b'{"pid": 1, "host": "h\\u001b[31m", "command": "' + b"x" * 5000 + b'"}',
                                     b"\xff\xfe" * 3000])
def test_a_crafted_lock_file_is_shown_only_as_plain_values(applied, content):
    holder = hold(applied)
    try:
        time.sleep(0.05)
        (applied.root / ".applier" / "lock").write_bytes(content)
        out = cli(*applied.args("revert"), env={"APPLIER_LOCK_TIMEOUT": "0.2"})
        assert out.code == 4 and "Traceback" not in out.text, out
        assert "\x1b" not in out.stderr and len(out.stderr) < 2000, out
    finally:
        release(holder)
