"""The reliability suite (issue 16): black-box tests through the CLI, every one marked slow.

Sections, one file each:
    test_rel_failpoints.py    apply / revert / overlay install / overlay uninstall killed at every failpoint
    test_rel_sigkill.py       the same four commands SIGKILLed at random moments (APPLIER_KILLS per command)
    test_rel_concurrency.py   8 concurrent writers (apply/revert) with status readers
    test_rel_confinement.py   copied installs, crafted state / journal / catalog: nothing outside changes
    test_rel_bad_inputs.py    every bad-input class ends with a documented exit code, never a traceback
    test_rel_fuzz.py          hypothesis over catalog TOML and state / journal / manifest JSON
                              (APPLIER_FUZZ_EXAMPLES examples per target)
    test_rel_links.py         links and special files in .applier/ and the tree, git metadata, a moved root,
                              signals, the remembered interpreter, hand edits (round 2, issue 22); links leading
                              out of the install on the tool's own walks: bytecode removal, temp-file sweeps,
                              detection and verify reads, a site-packages reached through a link, probes' bytecode
                              (round 3)
    test_rel_probes.py        interpreters, probes and nvidia-smi that misbehave (round 2, issue 22)
    test_rel_races.py         a link swapped in after every check, at the write (failpoints.HOOKS): apply, revert,
                              accept, overlay install and uninstall, recovery after a kill (round 3, issue 32;
                              APPLIER_RACE_RUNS runs each)
    test_rel_rights.py        saved edits never overwritten, copies no more readable than their originals, mode
                              bits and xattrs kept, deep trees refused, foreign pack folders left alone (round 3)
    test_rel_round3_inputs.py catalog bounds and unreadable entries, environment values, PYTHONINSPECT, verify's
                              bounded scans, `.` in catalog paths (round 3)
    test_rel_round4_disk.py   every writing verb on a full disk, free space swept around its threshold on a tmpfs
                              of the test's own (smalldisk.py; RLIMIT_FSIZE where it cannot mount) (round 4, issue 49)
    test_rel_round4_export.py `overlay export` all or nothing: full disk, killed while staging or renaming (round 4)
    test_rel_round4_rights.py each entry of .applier/ denied to the user who owns the install (round 4)
    test_rel_round4_signals.py SIGINT and SIGTERM at random moments, start-up included (APPLIER_SIGNAL_SAMPLES per
                              command and signal) (round 4)
    test_rel_round4_options.py every numeric option's edges; usage errors with --json (round 4)
    test_rel_round4_home.py   the overlay package in the environment's own site-packages (round 4)
    test_rel_round4_lock.py   the lock file names its holder; a stale holder said so (round 4)

Shared helpers live in reltools.py; `python -m benchmarks reliability` runs the sections and writes the figures.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for folder in (str(REPO), str(REPO / "tests"), str(HERE)):
    if folder not in sys.path:
        sys.path.insert(0, folder)

import reltools  # noqa: E402,F401  (captures the real os.fsync for forked runs before any test turns it off)


@pytest.fixture(autouse=True)
def no_fsync_in_this_process(monkeypatch):
    """The commands this process runs in-process (setup, recovery, checks) skip fsync: it only matters for power
    loss, which no test here simulates (a killed process loses nothing the kernel has), and it costs a second per
    test on a busy disk. Subprocesses, the ones that get killed, keep it."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture
def plain(tmp_path):
    """A plain install (a ComfyUI folder without a Python env) with the two-patch test catalog."""
    return reltools.make_install(tmp_path / "t", layout="plain")


@pytest.fixture
def applied(plain):
    """`plain` with both test patches applied."""
    reltools.assert_clean(reltools.cli(*plain.args("apply")), allowed=(0,))
    return plain
