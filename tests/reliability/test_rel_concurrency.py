"""Section 3, 8-way concurrency with status readers: eight writer processes apply and revert the same install over
and over while four reader processes run `status --json` without pause. Writers are serialised by the target's
lock and always succeed; a reader never reports drift (exit 5) or a mix of applied and not-applied patches
(every run of the test catalog applies or reverts both) while a run is in flight; at the end the install is whole
and consistent, and revert brings back the untouched tree. APPLIER_CONCURRENCY_ROUNDS sets the runs per writer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reltools import REPO, child_env, consistency_problems, make_install, record_figure, removal_problems

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("APPLIER_CONCURRENCY_ROUNDS", "10"))
WRITERS = 8
READERS = 4
WORKER = Path(__file__).with_name("cli_loop.py")


def start(spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)], env=child_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_eight_writers_and_status_readers(tmp_path):
    inst = make_install(tmp_path / "t")
    stop = tmp_path / "writers-done"
    apply_, revert = [str(a) for a in inst.args("apply")], [str(a) for a in inst.args("revert")]
    status = [str(a) for a in inst.args("status", "--json")]
    readers = [start({"commands": [status], "rounds": 0, "stop": str(stop), "out": str(tmp_path / f"r{i}.json")})
               for i in range(READERS)]
    writers = [start({"commands": [apply_, revert] if i % 2 == 0 else [revert, apply_], "rounds": ROUNDS,
                      "out": str(tmp_path / f"w{i}.json")}) for i in range(WRITERS)]
    try:
        logs = [w.communicate(timeout=600)[0] for w in writers]
    finally:
        stop.write_text("done")
        logs += [r.communicate(timeout=600)[0] for r in readers]
    for proc, log in zip(writers + readers, logs):
        assert proc.returncode == 0, f"a worker died: {log}"

    writes = [e for i in range(WRITERS) for e in json.loads((tmp_path / f"w{i}.json").read_text())]
    reads = [e for i in range(READERS) for e in json.loads((tmp_path / f"r{i}.json").read_text())]
    bad_writes = [e for e in writes if e["code"] != 0 or "output" in e]
    false_drift = [e for e in reads if e["code"] == 5]
    bad_reads = [e for e in reads if e["code"] != 0 or "output" in e]
    record_figure("concurrency", writes=len(writes), writes_failed=len(bad_writes), reads=len(reads),
                  reads_failed=len(bad_reads), false_drift=len(false_drift))
    assert len(writes) == WRITERS * ROUNDS
    assert not bad_writes, (f"{len(bad_writes)} of {len(writes)} writes failed (exit codes "
                            f"{[(e['command'], e['code']) for e in bad_writes[:5]]}):\n"
                            + "\n".join(e.get("output", "")[-1500:] for e in bad_writes[:3]))
    assert not false_drift, f"{len(false_drift)} of {len(reads)} status runs reported drift during a run:\n" + \
        "\n".join(e["output"][-1500:] for e in false_drift[:3])
    assert not bad_reads, (f"{len(bad_reads)} of {len(reads)} status runs failed or were incoherent "
                           f"(exit codes and patch states: {[(e['code'], e.get('states')) for e in bad_reads[:5]]}):\n"
                           + "\n".join(e["output"][-1500:] for e in bad_reads[:3]))
    problems = consistency_problems(inst, {("original", "absent"), ("patched", "absent")})
    assert not problems, "\n".join(problems)
    problems = removal_problems(inst)
    assert not problems, "\n".join(problems)
