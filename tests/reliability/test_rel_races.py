"""Reliability round 3 (issue 32): no race leads outside. A link swapped in after every check of a run, at the
moment a real attacker's polling loop wins (right before a target file is written: failpoints.HOOKS), never leads
a write, a removal or a read outside the install: every file operation goes through the install's held handle.

Deterministic: the swap happens in the run's own process at the hook, not by a timing loop. APPLIER_RACE_RUNS
(default 3) repeats each case with the swap at every file of the run in turn; the campaign ran 1,000 per command
(benchmarks/results/reliability-*.json)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from applier.store import failpoints
from reltools import (FAILPOINT_EXIT, REPO, assert_clean, child_env, cli, make_install, record_figure, run_writer,
                      snapshot)

pytestmark = pytest.mark.slow

VICTIM = b"precious = 1\n"
RUNS = int(os.environ.get("APPLIER_RACE_RUNS", "3"))


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    for name in ("nodes.py", "execution.py", "sub/keep.py"):
        (folder / name).write_bytes(VICTIM)
    return folder


def outside_intact(folder: Path) -> None:
    for name in ("nodes.py", "execution.py", "sub/keep.py"):
        assert (folder / name).read_bytes() == VICTIM, f"{name} outside the target was written"
    assert sorted(p.name for p in folder.rglob("*")) == ["execution.py", "keep.py", "nodes.py", "sub"], \
        sorted(str(p) for p in folder.rglob("*"))


@pytest.fixture
def swap_at():
    """swap_at(relpath, link_target, nth=1): at the nth write of a file whose path ends with relpath, rename a
    prepared link to link_target over it (what an attacker's loop does, at the worst moment)."""
    def arm(relpath: str, link_target: Path, nth: int = 1, *, folder: bool = False):
        seen = {"n": 0}

        def swap(place):
            if not place.relpath.endswith(relpath):
                return
            seen["n"] += 1
            if seen["n"] != nth:
                return
            victim = place.held.path / relpath if folder else place.path
            prepared = victim.with_name(victim.name + ".evil")
            prepared.symlink_to(link_target, target_is_directory=folder)
            if folder and victim.is_dir() and not victim.is_symlink():
                shutil.rmtree(victim)
            os.rename(prepared, victim)     # atomic: a rename over the file (or empty folder) the run is about to use
        failpoints.HOOKS["before-write"] = swap
    yield arm
    failpoints.HOOKS.clear()


def no_journal_left(root: Path) -> None:
    assert not (root / ".applier" / "journal.json").exists(), "a journal was left: every later command refuses"


def test_apply_never_writes_through_a_link_swapped_over_a_target_file(tmp_path, outside, swap_at):
    for run in range(RUNS):
        inst = make_install(tmp_path / f"t{run}", layout="plain")
        for name in ("execution.py", "nodes.py"):      # the first file the run writes, then the second
            swap_at(name, outside / name)
            out = assert_clean(cli(*inst.args("apply")), allowed=(8,))
            assert "outside" in out.text, out
            outside_intact(outside)
            no_journal_left(inst.root)
            (inst.root / name).unlink()             # the user puts the file back in place of the link
            (inst.root / name).write_bytes(inst.base_files[name])
            files = snapshot(inst.root)[0]
            assert files == inst.base_files, "the files this run had replaced were not rolled back"
        failpoints.HOOKS.clear()
        assert_clean(cli(*inst.args("apply")), allowed=(0,))       # and the install works afterwards
    record_figure("races", command="apply", runs=RUNS, writes_outside=0)

def test_revert_never_restores_into_a_link_swapped_over_a_target_file(tmp_path, outside, swap_at):
    for run in range(RUNS):
        inst = make_install(tmp_path / f"t{run}", layout="plain")
        assert_clean(cli(*inst.args("apply")), allowed=(0,))
        patched = snapshot(inst.root)[0]
        swap_at("nodes.py", outside / "nodes.py")
        out = assert_clean(cli(*inst.args("revert")), allowed=(8,))
        assert out.code != 0, "revert exited 0 after a link was swapped in"
        outside_intact(outside)
        no_journal_left(inst.root)
        (inst.root / "nodes.py").unlink()
        (inst.root / "nodes.py").write_bytes(patched["nodes.py"])
        failpoints.HOOKS.clear()
        assert snapshot(inst.root)[0] == patched, "revert was not all-or-nothing"
        assert_clean(cli(*inst.args("revert")), allowed=(0,))
        assert snapshot(inst.root)[0] == inst.base_files
    record_figure("races", command="revert", runs=RUNS, writes_outside=0)

def test_a_folder_swapped_for_a_link_on_the_way_is_never_written_through(tmp_path, outside, swap_at):
    """overlay install: custom_nodes/ turned into a link out, right before the node's first file is written."""
    for run in range(RUNS):
        inst = make_install(tmp_path / f"t{run}", layout="portable")

        def swap(place, inst=inst):
            if place.relpath.startswith("custom_nodes/") and not (inst.comfy / "custom_nodes").is_symlink():
                shutil.rmtree(inst.comfy / "custom_nodes")
                (inst.comfy / "custom_nodes").symlink_to(outside / "sub", target_is_directory=True)
        failpoints.HOOKS["before-write"] = swap
        out = assert_clean(cli("overlay", "install", "--target", inst.root), allowed=(8,))
        assert "outside" in out.text, out
        outside_intact(outside)
        no_journal_left(inst.root)
        failpoints.HOOKS.clear()
        assert not any(p.name == "fused_dit" for p in inst.site.iterdir()), "the package's files were not rolled back"
    record_figure("races", command="overlay-install", runs=RUNS, writes_outside=0)

def test_overlay_uninstall_never_removes_through_a_swapped_link(tmp_path, outside, swap_at):
    for run in range(RUNS):
        inst = make_install(tmp_path / f"t{run}", layout="portable")
        assert_clean(cli("overlay", "install", "--target", inst.root), allowed=(0,))
        node = inst.comfy / "custom_nodes" / "comfyui_fused_dit"
        first = sorted(p for p in node.rglob("*.py"))[0]
        shutil.copyfile(first, outside / "sub" / first.name)
        before = (outside / "sub" / first.name).read_bytes()

        def swap(place, node=node):
            if place.relpath.startswith("custom_nodes/comfyui_fused_dit/") and not node.is_symlink():
                shutil.rmtree(node)
                node.symlink_to(outside / "sub", target_is_directory=True)
        failpoints.HOOKS["before-write"] = swap
        out = assert_clean(cli("overlay", "uninstall", "--target", inst.root), allowed=(8,))
        assert out.code == 8
        failpoints.HOOKS.clear()
        assert (outside / "sub" / first.name).read_bytes() == before, "a file outside was removed"
        (outside / "sub" / first.name).unlink()
        outside_intact(outside)
    record_figure("races", command="overlay-uninstall", runs=RUNS, writes_outside=0)

def test_recovery_after_a_kill_never_finishes_through_a_swapped_link(tmp_path, outside, monkeypatch):
    """Killed after the journal (in a child process once, then in-process: the failpoint raises where the child's
    process ends), a link swapped over a file the journal names: the next command refuses, nothing outside."""
    inst = make_install(tmp_path / "child", layout="plain")
    proc = subprocess.run([sys.executable, "-m", "applier", *map(str, inst.args("apply"))], cwd=REPO,
                          env=child_env({"APPLIER_FAILPOINT": "after-journal"}), capture_output=True, text=True)
    assert proc.returncode == FAILPOINT_EXIT, proc.stderr
    installs = [inst]

    class Killed(BaseException):
        pass

    def die(name):
        if name in ("after-journal", "after-first-file"):
            raise Killed(name)
    for run in range(RUNS):
        other = make_install(tmp_path / f"t{run}", layout="plain")
        with monkeypatch.context() as patched, pytest.raises(Killed):
            patched.setattr(run_writer(), "failpoint", die)
            cli(*other.args("apply"))
        installs.append(other)
    for inst in installs:
        assert inst.journal.exists()
        for name in ("nodes.py", "execution.py"):
            (inst.root / name).unlink()
            (inst.root / name).symlink_to(outside / name)
        out = assert_clean(cli(*inst.args("status")), allowed=(7, 8))
        assert "outside" in out.text or "neither" in out.text, out
        outside_intact(outside)
    record_figure("races", command="recovery-after-kill", runs=len(installs), writes_outside=0)


def test_a_link_swapped_into_applier_s_own_folder_is_refused_at_the_write(tmp_path, outside, monkeypatch):
    """The backups are written through the state folder's handle, which follows no link at all."""
    from applier.store.heldroot import HeldRoot
    inst = make_install(tmp_path / "t", layout="plain")
    real_write = HeldRoot.write

    def write(self, rel, data, **kw):
        backups = self.path / "backups"
        if self.path.name == ".applier" and str(rel).startswith("backups/") and not backups.is_symlink():
            shutil.rmtree(backups, ignore_errors=True)
            backups.symlink_to(outside / "sub", target_is_directory=True)
        return real_write(self, rel, data, **kw)
    monkeypatch.setattr(HeldRoot, "write", write)
    out = assert_clean(cli(*inst.args("apply")), allowed=(7, 8))
    assert out.code != 0
    outside_intact(outside)
    assert snapshot(inst.root)[0] == inst.base_files


def test_accept_never_records_through_a_link_swapped_into_the_state_folder(tmp_path, outside):
    for run in range(RUNS):
        inst = make_install(tmp_path / f"t{run}", layout="plain")
        assert_clean(cli(*inst.args("apply")), allowed=(0,))
        nodes = inst.root / "nodes.py"
        nodes.write_text(nodes.read_text() + "# my own line\n")
        state = inst.root / ".applier" / "state.json"

        def swap(store, state=state):
            if not state.is_symlink():
                prepared = state.with_name("state.json.evil")
                prepared.symlink_to(outside / "nodes.py")
                os.rename(prepared, state)
        failpoints.HOOKS["before-state"] = swap
        out = assert_clean(cli(*inst.args("accept", "--only", "comfyui/maxres")), allowed=(7,))
        assert "symbolic link" in out.text, out
        failpoints.HOOKS.clear()
        outside_intact(outside)
        state.unlink()                                  # the user moves the link aside: the next command finishes
        assert_clean(cli(*inst.args("status")), allowed=(0, 5))
        outside_intact(outside)
        assert "accepted" in state.read_text()
    record_figure("races", command="accept", runs=RUNS, writes_outside=0)
