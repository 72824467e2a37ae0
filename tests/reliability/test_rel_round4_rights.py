"""Reliability round 4 (issue 49): permission denied on each file and folder of `.applier/`, one at a time, for the
commands that read or write there, run as a user who owns the install but not that entry. Every case ends in a
documented code without a traceback; a refusal to read is exit 8 (never 7, "corrupt") with a hint; a message that
says "nothing was changed" is true to the byte; one that is not says what the next command finishes; and once the
entry is readable again, the next command leaves a whole state with no journal pending."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from reltools import (Outcome, assert_clean, classify, cli, fork_cli, make_install, problems_of, record_figure,
                      snapshot, state_files, wait_exit)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(os, "fork"), reason="runs the command as another user in a fork")]

NOTHING = "nothing was changed"
USER = 65534            # nobody: owns the install, not the entry made unreadable
COMMANDS = {            # argv -> whole states the tree may be in after it, from (patched, installed)
    ("status",): {("patched", "installed")},
    ("list",): {("patched", "installed")},
    ("apply",): {("patched", "installed")},
    ("revert",): {("patched", "installed"), ("original", "installed")},
    ("revert", "--forget"): {("patched", "installed")},
    ("overlay", "list"): {("patched", "installed")},
    ("overlay", "uninstall"): {("patched", "installed"), ("patched", "absent")},
    ("overlay", "install"): {("patched", "installed")},
}


@pytest.fixture
def base():
    """A folder the other user can reach (the test's own tmp_path is private to root)."""
    if os.geteuid() != 0:
        pytest.skip("runs the commands as another user: needs root (as a user, chmod alone cannot deny the owner "
                    "what the owner may grant back: the test would prove nothing)")
    folder = Path(tempfile.mkdtemp(prefix="rel-rights-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_user(inst, *argv) -> Outcome:
    out = inst.root.parent / "out.txt"

    def drop():
        os.setgroups([])
        os.setgid(USER)
        os.setuid(USER)

    pid = fork_cli(*inst.args(*argv), output=out, before=drop, env={"APPLIER_LOCK_TIMEOUT": "1"})
    code = wait_exit(pid, 120)
    return Outcome(argv, -1 if code is None else code, out.read_text(errors="replace"), "")


def chown_tree(root: Path, uid: int) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(folder, name), uid, uid)
    os.lchown(root, uid, uid)


def entries(state: Path) -> list[str]:
    out = [""]
    for folder, dirs, files in os.walk(state):
        for name in sorted([*dirs, *files]):
            out.append(str(Path(folder, name).relative_to(state)))
    return out


def test_each_entry_of_the_state_folder_denied(base):
    inst = make_install(base / "t", layout="portable")
    for step in (("apply",), ("overlay", "install")):
        assert_clean(cli(*inst.args(*step)), allowed=(0,))
    saved = base / "saved"
    shutil.copytree(inst.root, saved, symlinks=True)
    tried = held = 0
    problems = []
    for entry in entries(inst.root / ".applier"):
        for argv, allowed in COMMANDS.items():
            shutil.rmtree(inst.root)
            shutil.copytree(saved, inst.root, symlinks=True)
            chown_tree(inst.root, USER)
            denied = inst.root / ".applier" / entry
            os.lchown(denied, 0, 0)
            os.chmod(denied, 0o700 if denied.is_dir() else 0o600)
            before_tree, before_state = snapshot(inst.root), state_files(inst)
            out = as_user(inst, *argv)
            found = problems_of(out, allowed=(0, 4, 5, 8))
            if out.code == 7:
                found.append("a denied read reported as a corrupt state (7)")
            if out.code == 8 and "hint:" not in out.text:
                found.append("exit 8 without a hint")
            if out.code != 0 and NOTHING in out.text and (snapshot(inst.root) != before_tree
                                                          or state_files(inst) != before_state):
                found.append(f"says '{NOTHING}' but something changed")
            chown_tree(inst.root, 0)
            after = cli(*inst.args("status"))      # the next command, with the entry readable again
            if after.code not in (0, 5) or problems_of(after, allowed=(0, 5)):
                found.append(f"the next command: {after}")
            whole, why = classify(inst)
            if whole not in allowed:
                found.append(f"left {whole or why}, expected one of {sorted(allowed)}")
            if inst.journal.exists():
                found.append("a journal still pending after the next command")
            tried += 1
            if found:
                problems.append(f".applier/{entry} denied, {' '.join(argv)} -> exit {out.code}: {'; '.join(found)}"
                                f"\n    {out.text.strip()[-400:]}")
            else:
                held += 1
    record_figure("round4-rights", tried=tried, held=held, entries=len(entries(inst.root / ".applier")),
                  commands=len(COMMANDS))
    assert not problems, "\n".join(problems[:12])
