"""Section 7 (reliability round 2): no link leads a write, read or removal outside the target; no special file
hangs a command; git metadata is never written; a moved install aborts the run; signals end with their codes; the
interpreter given once is remembered; a hand edit can be accepted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reltools import (PATCHED, REPO, assert_clean, child_env, cli, make_install, run, run_writer, snapshot,
                      state_files)
from shelltools import make_catalog, make_comfy, run_git

pytestmark = pytest.mark.slow

VICTIM = b"precious = 1\n"


@pytest.fixture
def outside(tmp_path):
    """A folder outside the target holding another install's nodes.py: nothing may touch it."""
    folder = tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    (folder / "nodes.py").write_bytes(VICTIM)
    (folder / "sub" / "keep.py").write_bytes(VICTIM)
    return folder


def outside_intact(folder: Path) -> None:
    assert (folder / "nodes.py").read_bytes() == VICTIM, "a file outside the target was written"
    assert (folder / "sub" / "keep.py").read_bytes() == VICTIM, "a folder outside the target was changed"
    assert sorted(p.name for p in folder.iterdir()) == ["nodes.py", "sub"], sorted(os.listdir(folder))


# ------------------------------------------------------------------------------ links inside .applier/

def test_a_linked_backup_folder_is_refused_before_apply_writes(plain, outside):
    (plain.root / ".applier" / "backups").mkdir(parents=True)
    (plain.root / ".applier" / "backups" / "comfyui").symlink_to(outside, target_is_directory=True)
    out = assert_clean(cli(*plain.args("apply")), allowed=(7,))
    assert "symbolic link" in out.text
    outside_intact(outside)
    assert snapshot(plain.root)[0] == plain.base_files, "the target changed"


def test_a_deeper_linked_backup_folder_is_refused_before_revert_removes(applied, outside):
    backups = applied.root / ".applier" / "backups" / "comfyui"
    victim_dir = backups / "maxres"
    import shutil
    shutil.move(str(victim_dir), str(outside / "moved-backup"))
    victim_dir.symlink_to(outside / "sub", target_is_directory=True)
    assert_clean(cli(*applied.args("revert")), allowed=(7,))
    outside_intact_after_move(outside)


def outside_intact_after_move(folder: Path) -> None:
    assert (folder / "nodes.py").read_bytes() == VICTIM
    assert (folder / "sub" / "keep.py").read_bytes() == VICTIM, "revert removed a folder outside the target"


def test_a_linked_displaced_folder_is_refused_before_a_forced_revert(applied, outside):
    (applied.comfy / "nodes.py").write_bytes(b"edited by hand\n")
    (applied.root / ".applier" / "displaced").symlink_to(outside, target_is_directory=True)
    assert_clean(cli(*applied.args("revert", "--force")), allowed=(7,))
    outside_intact(outside)
    assert (applied.comfy / "nodes.py").read_bytes() == b"edited by hand\n"


@pytest.mark.parametrize("command", [("apply",), ("status",), ("revert",), ("verify",), ("clean",),
                                     ("overlay", "list")])
def test_applier_folder_itself_as_a_link_is_refused_by_every_command(plain, outside, command):
    (plain.root / ".applier").symlink_to(outside, target_is_directory=True)
    out = assert_clean(cli(*plain.args(*command)), allowed=(7,))
    assert ".applier" in out.text and "symbolic link" in out.text
    outside_intact(outside)
    assert (plain.root / ".applier").is_symlink()


def test_two_installs_can_never_share_one_state(tmp_path):
    a = make_install(tmp_path / "a", layout="plain")
    b = make_install(tmp_path / "b", layout="plain")
    assert_clean(cli(*a.args("apply")), allowed=(0,))
    (b.root / ".applier").symlink_to(a.root / ".applier", target_is_directory=True)
    before = state_files(a)
    for command in (("apply",), ("revert",), ("status",)):
        assert_clean(cli(*b.args(*command)), allowed=(7,))
    assert state_files(a) == before
    assert snapshot(b.root)[0] == b.base_files


def test_a_state_file_linked_to_dev_zero_is_refused_not_read(applied):
    state = applied.root / ".applier" / "state.json"
    state.unlink()
    state.symlink_to("/dev/zero")
    start = time.monotonic()
    assert_clean(run(*applied.args("status")), allowed=(7,))
    assert time.monotonic() - start < 60


# ------------------------------------------------------------------------------ special files never hang

FIFO_PLACES = ["state.json", "overlays.json", "journal.json", "python.json", "lock"]


@pytest.mark.parametrize("name", FIFO_PLACES)
def test_a_fifo_inside_the_state_folder_ends_with_exit_7(applied, name):
    path = applied.root / ".applier" / name
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    for command in (("status",), ("apply",), ("revert",)):
        out = run(*applied.args(*command), timeout=60)
        assert_clean(out, allowed=(7,))
        assert "FIFO" in out.text


def test_a_fifo_journal_blob_of_an_interrupted_run_ends_with_exit_7(applied):
    out = run(*applied.args("revert"), env={"APPLIER_FAILPOINT": "after-journal"})
    assert out.code == 77
    blobs = sorted((applied.root / ".applier" / "journal-data").iterdir())
    blobs[-1].unlink()
    os.mkfifo(blobs[-1])
    assert_clean(run(*applied.args("status"), timeout=60), allowed=(7,))


def test_a_fifo_in_place_of_nodes_py_ends_with_a_documented_code(plain):
    (plain.comfy / "nodes.py").unlink()
    os.mkfifo(plain.comfy / "nodes.py")
    for command in (("apply",), ("status",), ("verify",)):
        out = run(*plain.args(*command), timeout=60)
        assert_clean(out)
    assert (plain.comfy / "nodes.py").is_fifo()


def test_state_nested_a_thousand_levels_deep_is_exit_7(applied):
    deep = "[" * 1000 + "]" * 1000
    for name, command in (("state.json", ("status",)), ("overlays.json", ("overlay", "list"))):
        saved = applied.root / ".applier" / name
        old = saved.read_bytes() if saved.exists() else None
        saved.write_text(deep)
        assert_clean(cli(*applied.args(*command)), allowed=(7,))
        saved.unlink()
        if old is not None:
            saved.write_bytes(old)


def test_a_journal_nested_a_thousand_levels_deep_is_exit_7(applied):
    (applied.root / ".applier" / "journal.json").write_text('{"files": ' + "[" * 1000 + "]" * 1000 + "}")
    assert_clean(cli(*applied.args("status")), allowed=(7,))


# ------------------------------------------------------------------------------ git metadata is never written

def git_install(tmp_path) -> tuple[Path, Path]:
    comfy = make_comfy(tmp_path / "g", git=True)
    return comfy, make_catalog(tmp_path)


def test_a_gitdir_file_naming_another_repository_is_never_written(tmp_path):
    comfy, catalog = git_install(tmp_path)
    other = make_comfy(tmp_path / "other", git=True)
    exclude = other / ".git" / "info" / "exclude"
    before = exclude.read_bytes()
    import shutil
    shutil.rmtree(comfy / ".git")
    (comfy / ".git").write_text(f"gitdir: {other / '.git'}\n")
    assert_clean(cli("apply", "--target", comfy, "--patches", catalog), allowed=(0,))
    assert exclude.read_bytes() == before, "another repository's exclude file was written"


def test_a_linked_git_info_folder_gets_nothing_written(tmp_path, outside):
    comfy, catalog = git_install(tmp_path)
    import shutil
    shutil.rmtree(comfy / ".git" / "info")
    (comfy / ".git" / "info").symlink_to(outside, target_is_directory=True)
    assert_clean(cli("apply", "--target", comfy, "--patches", catalog), allowed=(0,))
    outside_intact(outside)


def test_a_linked_exclude_file_is_never_copied_into_the_tree(tmp_path):
    comfy, catalog = git_install(tmp_path)
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "token").write_text("s3cret\n")
    exclude = comfy / ".git" / "info" / "exclude"
    exclude.unlink()
    exclude.symlink_to(secret_dir / "token")
    assert_clean(cli("apply", "--target", comfy, "--patches", catalog), allowed=(0,))
    assert exclude.is_symlink() and (secret_dir / "token").read_text() == "s3cret\n"
    found = [p for p in comfy.rglob("*") if p.is_file() and not p.is_symlink() and b"s3cret" in p.read_bytes()]
    assert not found, found


def test_a_worktree_keeps_applier_out_of_git_status_without_touching_the_main_checkout(tmp_path):
    comfy, catalog = git_install(tmp_path)
    worktree = tmp_path / "wt"
    run_git(comfy, "worktree", "add", "-q", "--detach", str(worktree))
    exclude = comfy / ".git" / "info" / "exclude"
    before = exclude.read_bytes()
    assert_clean(cli("apply", "--target", worktree, "--patches", catalog), allowed=(0,))
    assert exclude.read_bytes() == before, "the main checkout's exclude file was written"
    porcelain = run_git(worktree, "status", "--porcelain")
    assert ".applier" not in porcelain and "nodes.py" in porcelain


# ------------------------------------------------------------------------------ the target's identity

def test_a_target_moved_while_apply_runs_aborts_and_leaves_no_stray_tree(plain, monkeypatch, tmp_path):
    writer = run_writer()
    moved = tmp_path / "moved"
    real = writer.failpoint

    def move_at(name):
        if name == "after-journal":
            os.rename(plain.root, moved)
        real(name)

    monkeypatch.setattr(writer, "failpoint", move_at)
    out = assert_clean(cli(*plain.args("apply")), allowed=(9,))
    assert "moved" in out.text
    assert not plain.root.exists(), "a stray tree appeared at the old path"
    monkeypatch.setattr(writer, "failpoint", real)
    # the journal travelled with the install: its next command finishes the run there
    status = assert_clean(cli("status", "--target", moved, "--patches", plain.catalog, "--json"), allowed=(0,))
    assert {p["state"] for p in status.json()["patches"]} == {"applied"}
    assert (moved / "nodes.py").read_bytes() == PATCHED["nodes.py"]


def test_a_target_deleted_while_apply_runs_is_not_recreated(plain, monkeypatch):
    import shutil
    writer = run_writer()
    real = writer.failpoint

    def delete_at(name):
        if name == "after-backups":
            shutil.rmtree(plain.root)
        real(name)

    monkeypatch.setattr(writer, "failpoint", delete_at)
    assert_clean(cli(*plain.args("apply")), allowed=(9,))
    assert not plain.root.exists(), "the run recreated a deleted install"


# ------------------------------------------------------------------------------ signals

def hold_lock(root: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; from applier.store.state import StateStore\n"
         "from applier.store.confine import Confinement; from pathlib import Path\n"
         f"d = Path({str(root / '.applier')!r})\n"
         "with StateStore(d, Confinement({}, d)).locked():\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env=child_env())
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_end_with_their_documented_codes(plain, signum, code):
    holder = hold_lock(plain.root)
    try:
        # SIGINT back to its default in the child: a suite started as a background job inherits it ignored, and
        # Python then never turns it into KeyboardInterrupt (a user's terminal always delivers it)
        proc = subprocess.Popen([sys.executable, "-m", "applier", *map(str, plain.args("apply"))], cwd=REPO,
                                env=child_env({"APPLIER_LOCK_TIMEOUT": "60"}), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(2.0)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err
        assert "Traceback" not in err
    finally:
        holder.kill()
        holder.wait()
    assert_clean(cli(*plain.args("apply")), allowed=(0,))


# ------------------------------------------------------------------------------ the interpreter is remembered

def test_an_interpreter_outside_the_install_is_given_once(tmp_path):
    comfy = make_comfy(tmp_path / "c")
    (comfy / "custom_nodes").mkdir()
    catalog = make_catalog(tmp_path)
    env = tmp_path / "conda-like-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    python = env / "bin" / "python"
    base = ("--target", comfy, "--patches", catalog)
    assert_clean(cli("overlay", "install", *base, "--python", python), allowed=(0,))
    assert_clean(cli("apply", *base, "--python", python), allowed=(0,))
    listed = assert_clean(cli("overlay", "list", *base, "--json"), allowed=(0,)).json()
    assert listed["installed"] and listed["modified"] == listed["missing"] == 0
    assert listed["python"] == str(python)
    status = assert_clean(cli("status", *base), allowed=(0,))
    assert f"python: {python} (recorded for this install)" in status.stdout
    assert_clean(cli("verify", *base), allowed=(0,))
    assert_clean(cli("overlay", "uninstall", *base), allowed=(0,))
    assert_clean(cli("revert", *base), allowed=(0,))
    assert not list((Path(env) / "lib").rglob("fused_dit")), "the overlay package stayed in the env"


def test_a_crafted_recorded_interpreter_is_refused(applied):
    (applied.root / ".applier" / "python.json").write_text(json.dumps({"python": "/bin/rm"}))
    out = assert_clean(cli(*applied.args("status")), allowed=(7,))
    assert "not the name of a Python interpreter" in out.text


# ------------------------------------------------------------------------------ after a hand edit

def test_status_after_a_hand_edit_offers_what_works_and_accept_keeps_the_edit(applied):
    nodes = applied.comfy / "nodes.py"
    edited = nodes.read_bytes() + b"# my own tweak\n"
    nodes.write_bytes(edited)
    status = cli(*applied.args("status"))
    assert status.code == 5
    for way in ("applier accept", "--forget", "--force", "keep the edit, drop the patch's hunks"):
        assert way in status.stdout, status.stdout
    assert_clean(cli(*applied.args("accept", "--only", "comfyui/maxres")), allowed=(0,))
    states = {p["id"]: p["state"] for p in cli(*applied.args("status", "--json")).json()["patches"]}
    assert states["comfyui/maxres"] == "applied"
    assert_clean(cli(*applied.args("revert")), allowed=(0,))
    after = nodes.read_bytes()
    assert b"# my own tweak" in after and b"40960" not in after, "revert lost the accepted edit"


def test_accept_refuses_a_file_whose_patch_is_gone(applied):
    (applied.comfy / "nodes.py").write_bytes(b"MAX_RESOLUTION=8\n")
    out = assert_clean(cli(*applied.args("accept", "--only", "comfyui/maxres")), allowed=(3,))
    assert "--forget" in out.text


def load_prestartup():
    import importlib.util
    path = REPO / "overlays" / "comfyui_fused_dit" / "prestartup_script.py"
    spec = importlib.util.spec_from_file_location("prestartup_under_test", path)
    module = importlib.util.module_from_spec(spec)
    import unittest.mock
    with unittest.mock.patch("builtins.print"):    # its module-level call looks at its own (absent) install
        spec.loader.exec_module(module)
    return module


def test_the_startup_warning_tells_an_edit_from_an_update_and_never_hangs(applied):
    import io
    prestartup = load_prestartup()
    nodes = applied.comfy / "nodes.py"
    nodes.write_bytes(nodes.read_bytes() + b"# tweak\n")
    stream = io.StringIO()
    assert prestartup.warn_if_lost(applied.comfy, stream) == ["comfyui/maxres"]
    line = stream.getvalue()
    assert "edited since apply" in line and "applier accept" in line and "lost by an update" not in line
    nodes.unlink()
    os.mkfifo(nodes)
    assert prestartup.warn_if_lost(applied.comfy, io.StringIO()) == ["comfyui/maxres"]   # returns, no hang
    state = applied.root / ".applier" / "state.json"
    state.unlink()
    os.mkfifo(state)
    assert prestartup.warn_if_lost(applied.comfy, io.StringIO()) == []


def test_the_recorded_interpreter_is_used_before_the_install_venv_is_even_asked(tmp_path):
    comfy = make_comfy(tmp_path / "c")
    catalog = make_catalog(tmp_path)
    marker = tmp_path / "venv-python-was-run"
    fake = comfy / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 30\n")
    fake.chmod(0o755)
    env = tmp_path / "shared-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    base = ("--target", comfy, "--patches", catalog)
    assert_clean(cli("apply", *base, "--python", env / "bin" / "python"), allowed=(0,))
    marker.unlink(missing_ok=True)
    out = assert_clean(cli("status", *base, "--json"), allowed=(0,))
    assert out.json()["python"] == str(env / "bin" / "python")
    assert not marker.exists(), "the install's own (hanging) venv python was asked first"


# ------------------------------------------------------------------------------ round 3: links out on the tool's walks
# Each of these broke before round 3: the tool listed, read or removed something outside the install through a link
# on a walk it makes beside the files it patches (bytecode, temp-file sweeps, detection, verify, its interpreter).

PYC = b"compiled bytes nobody may delete\n"


def pyc_outside(tmp_path: Path, *stems: str) -> Path:
    folder = tmp_path / "pyc-outside"
    folder.mkdir()
    for stem in stems:
        (folder / f"{stem}.cpython-311.pyc").write_bytes(PYC)
    return folder


def pyc_intact(folder: Path, *stems: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{s}.cpython-311.pyc" for s in stems), \
        "bytecode outside the target was removed through a linked __pycache__"


def test_a_linked_pycache_is_never_emptied_by_apply_or_revert(plain, tmp_path):
    outside = pyc_outside(tmp_path, "nodes", "execution")
    (plain.comfy / "__pycache__").symlink_to(outside, target_is_directory=True)
    assert_clean(cli(*plain.args("apply")), allowed=(0,))
    pyc_intact(outside, "nodes", "execution")
    assert_clean(cli(*plain.args("revert")), allowed=(0,))
    pyc_intact(outside, "nodes", "execution")
    assert snapshot(plain.root)[0] == plain.base_files


def test_a_linked_pycache_in_the_overlay_is_never_emptied_by_uninstall(tmp_path):
    inst = make_install(tmp_path / "t", layout="portable")
    assert_clean(cli(*inst.args("overlay", "install")), allowed=(0,))
    node = inst.comfy / "custom_nodes" / "comfyui_fused_dit"
    stems = sorted(p.stem for p in node.glob("*.py"))
    outside = pyc_outside(tmp_path, *stems)
    (node / "__pycache__").symlink_to(outside, target_is_directory=True)
    assert_clean(cli(*inst.args("overlay", "uninstall")), allowed=(0,))
    pyc_intact(outside, *stems)


def test_no_command_sweeps_temp_files_where_a_link_leads_out_of_the_install(plain, tmp_path):
    """The temp-file sweep (of a killed write) walks every folder a patch or the overlay pack writes to: with
    custom_nodes/ a link to another folder, a file there named like applier's temp files is someone else's."""
    other = tmp_path / "other-nodes"
    (other / "comfyui_fused_dit").mkdir(parents=True)
    theirs = other / "comfyui_fused_dit" / ".notes.txt.k3j2.applier-tmp"
    theirs.write_bytes(VICTIM)
    shutil_move_and_link(plain.comfy / "custom_nodes", other)
    for command in (("status",), ("apply",), ("revert",), ("overlay", "list")):
        assert_clean(cli(*plain.args(*command)))
        assert theirs.read_bytes() == VICTIM, f"`{' '.join(command)}` removed a file outside the install"


def shutil_move_and_link(path: Path, dest: Path) -> None:
    import shutil
    for entry in path.iterdir():
        shutil.move(str(entry), str(dest / entry.name))
    path.rmdir()
    path.symlink_to(dest, target_is_directory=True)


def test_overlay_install_refuses_a_linked_node_folder_before_reading_it(tmp_path, outside):
    inst = make_install(tmp_path / "t", layout="portable")
    (outside / "node").mkdir()
    (outside / "node" / "__init__.py").write_bytes(VICTIM)
    (inst.comfy / "custom_nodes" / "comfyui_fused_dit").symlink_to(outside / "node", target_is_directory=True)
    out = assert_clean(cli(*inst.args("overlay", "install")), allowed=(7,))
    assert "link" in out.text and "exists and was not installed" not in out.text
    assert (outside / "node" / "__init__.py").read_bytes() == VICTIM
    assert sorted(p.name for p in (outside / "node").iterdir()) == ["__init__.py"]


def test_a_site_packages_a_link_leads_out_of_the_install_is_not_used(tmp_path):
    inst = make_install(tmp_path / "t", layout="portable")
    elsewhere = tmp_path / "elsewhere-site"
    elsewhere.mkdir()
    inst.site.rmdir()
    inst.site.symlink_to(elsewhere, target_is_directory=True)
    out = assert_clean(cli(*inst.args("overlay", "install")), allowed=(3,))
    assert "link leading out of the install" in out.text
    assert list(elsewhere.iterdir()) == [], "the overlay package was written through the link"
    detected = assert_clean(cli("detect", "--target", inst.root, "--json"), allowed=(0,)).json()
    assert detected["site_packages"] is None and "link" in detected["site_packages_problem"]
    assert any("put the folder itself in place of the link" in n for n in detected["notes"])
    # the ComfyUI patches still apply: only the root reached through the link is left alone
    assert_clean(cli(*inst.args("apply")), allowed=(0,))
    assert list(elsewhere.iterdir()) == []


def test_a_site_packages_swapped_for_a_link_after_install_is_never_written(tmp_path, outside):
    """A race a user can cause between two commands: the install's site-packages moved elsewhere and linked back."""
    import shutil
    inst = make_install(tmp_path / "t", layout="portable")
    assert_clean(cli(*inst.args("overlay", "install")), allowed=(0,))
    shutil.move(str(inst.site), str(outside / "site"))
    inst.site.symlink_to(outside / "site", target_is_directory=True)
    before = {str(p): p.read_bytes() for p in (outside / "site").rglob("*") if p.is_file()}
    for command in (("overlay", "uninstall"), ("overlay", "install"), ("overlay", "list")):
        out = assert_clean(cli(*inst.args(*command)))
        assert out.code != 0, out
    assert {str(p): p.read_bytes() for p in (outside / "site").rglob("*") if p.is_file()} == before


def test_detection_reads_no_version_file_a_link_leads_out_of_the_install(plain, tmp_path):
    foreign = tmp_path / "foreign_version.py"
    foreign.write_text('__version__ = "9.9.9"\n')
    (plain.comfy / "comfyui_version.py").unlink()
    (plain.comfy / "comfyui_version.py").symlink_to(foreign)
    found = assert_clean(cli("detect", "--target", plain.root, "--json"), allowed=(0,)).json()
    assert found["comfyui_version"] != "9.9.9"
    assert any("link leading outside" in n for n in found["notes"]), found["notes"]


def test_verify_scans_no_custom_nodes_folder_a_link_leads_out_of_the_install(plain, tmp_path):
    other = tmp_path / "elsewhere"
    (other / "pack").mkdir(parents=True)
    (other / "pack" / "caps.py").write_text("MAX_RESOLUTION = 1024\n")
    (plain.comfy / "custom_nodes").rmdir()
    (plain.comfy / "custom_nodes").symlink_to(other, target_is_directory=True)
    out = cli(*plain.args("verify", "--only", "resolution-caps", "--json"))
    assert_clean(out, allowed=(0, 6))
    [check] = [c for c in out.json()["checks"] if c["name"] == "resolution-caps"]
    assert not any("caps.py" in c for c in check["numbers"].get("caps", [])), check
    assert "custom_nodes/: a link leading outside the ComfyUI folder" in check["numbers"]["skipped"]


def test_probes_write_no_bytecode_into_the_target(tmp_path):
    """A probe imports the target's code in the target's interpreter: with a __pycache__ there that is a link, an
    interpreter writing bytecode would write outside; no probe writes bytecode at all (-B)."""
    from verify.runner import run_probe
    code = tmp_path / "target-code"
    code.mkdir()
    (code / "mod.py").write_text("VALUE = 1\n")
    sink = tmp_path / "bytecode-sink"
    sink.mkdir()
    (code / "__pycache__").symlink_to(sink, target_is_directory=True)
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "imports.py").write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(code)!r})\n"
        "import mod\n"
        "print(json.dumps({'outcome': 'PASS', 'reason': 'imported', 'numbers': {'value': mod.VALUE}}))\n")
    result = run_probe(sys.executable, "imports", {}, 60, probes_dir=probes)
    assert result.numbers.get("value") == 1, result
    assert list(sink.iterdir()) == [], "the probe wrote bytecode through the target's linked __pycache__"


def test_the_manifest_is_not_read_through_a_linked_state_folder(plain, outside, monkeypatch):
    from applier.store.heldroot import HeldRoot
    (outside / "overlays.json").write_text(json.dumps({"format": 2, "package": "evil", "node": "evil", "files": []}))
    (plain.root / ".applier").symlink_to(outside, target_is_directory=True)
    opened = []
    real = HeldRoot.read      # every read of the state folder goes through its held handle

    def recording(self, rel, **kw):
        opened.append(self.display(rel))
        return real(self, rel, **kw)

    monkeypatch.setattr(HeldRoot, "read", recording)
    for command in (("overlay", "list"), ("overlay", "uninstall")):
        assert_clean(cli(*plain.args(*command)), allowed=(7,))
    assert not [p for p in opened if p.parent == plain.root / ".applier"], opened


def test_a_fifo_pyvenv_cfg_is_a_note_not_a_20_second_wait(tmp_path):
    comfy = make_comfy(tmp_path / "c")
    env = comfy / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    (env / "pyvenv.cfg").unlink()
    os.mkfifo(env / "pyvenv.cfg")
    start = time.monotonic()
    out = assert_clean(run("detect", "--target", comfy, "--json", timeout=60), allowed=(0,))
    assert time.monotonic() - start < 15, "the interpreter was run and waited on its FIFO pyvenv.cfg"
    assert "FIFO" in out.json()["python_problem"]


def test_a_journal_blob_far_too_large_is_damaged_journal_data(applied):
    out = run(*applied.args("revert"), env={"APPLIER_FAILPOINT": "after-journal"})
    assert out.code == 77
    blob = sorted((applied.root / ".applier" / "journal-data").iterdir())[0]
    blob.unlink()
    with open(blob, "wb") as handle:
        handle.truncate(10 * 1024 ** 3)     # sparse: no disk used
    for command in (("status",), ("revert",), ("apply",)):
        out = assert_clean(cli(*applied.args(*command)), allowed=(7,))
        assert "damaged" in out.text
