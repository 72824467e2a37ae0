"""Section 4, confinement: a copied or moved install works on itself; a crafted state.json or journal.json (paths
outside the target, "..", absolute paths, a symlink out of the tree, blobs outside .applier/, a root nobody
knows) is refused with exit 7 and nothing outside the target changes; a catalog can never write into .applier/."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reltools import (PATCHED, REPO, assert_clean, cli, make_install, run, sha256, snapshot, state_files)
from shelltools import NODES_PY, write_patch

pytestmark = pytest.mark.slow

PAYLOAD = b"pwned = True\n"
VICTIM = b"precious = 1\n"


def cp_a(src: Path, dest: Path) -> None:
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)


# ------------------------------------------------------------------------------------------ copied and moved installs

def test_revert_on_a_copied_install_restores_the_copy_and_leaves_the_original(tmp_path):
    inst = make_install(tmp_path / "a", layout="plain")
    assert_clean(run(*inst.args("apply")), allowed=(0,))
    original_files, original_state = snapshot(inst.root)[0], state_files(inst)
    copy = tmp_path / "copy" / "ComfyUI"
    copy.parent.mkdir()
    cp_a(inst.root, copy)

    assert_clean(run("revert", "--target", copy, "--patches", inst.catalog), allowed=(0,))
    assert snapshot(copy)[0] == inst.base_files, "the copy was not restored"
    assert snapshot(inst.root)[0] == original_files, "revert of the copy changed the original"
    assert state_files(inst) == original_state
    status = cli("status", "--target", copy, "--patches", inst.catalog, "--json").json()
    assert {p["state"] for p in status["patches"]} == {"not-applied"}
    states = {p["state"] for p in cli(*inst.args("status", "--json")).json()["patches"]}
    assert states == {"applied"}

    moved = tmp_path / "moved" / "ComfyUI"
    moved.parent.mkdir()
    shutil.move(str(inst.root), str(moved))
    out = assert_clean(cli("status", "--target", moved, "--patches", inst.catalog, "--json"), allowed=(0,))
    assert {p["state"] for p in out.json()["patches"]} == {"applied"}
    assert_clean(cli("revert", "--target", moved, "--patches", inst.catalog), allowed=(0,))
    assert snapshot(moved)[0] == inst.base_files


def test_overlay_uninstall_on_a_copied_install_removes_the_copys_files_only(tmp_path):
    inst = make_install(tmp_path / "a", layout="venv")
    assert_clean(cli(*inst.args("overlay", "install")), allowed=(0,))
    installed = snapshot(inst.root)
    copy = tmp_path / "copy" / "ComfyUI"
    copy.parent.mkdir()
    cp_a(inst.root, copy)
    assert_clean(cli("overlay", "uninstall", "--target", copy, "--patches", inst.catalog), allowed=(0,))
    files, dirs = snapshot(copy)
    assert not [k for k in files if k in inst.overlay.files], "the copy kept overlay files"
    assert not dirs & inst.overlay.dirs, "the copy kept overlay folders"
    assert snapshot(inst.root) == installed, "uninstall in the copy changed the original"
    listed = cli(*inst.args("overlay", "list", "--json")).json()
    assert listed["installed"] and listed["intact"] == len(inst.overlay.files)


# ------------------------------------------------------------------------------------------ crafted state.json

@pytest.fixture
def attacked(tmp_path):
    """An applied plain install, a folder outside it with a victim file and an attacker's payload, and a symlink
    inside the tree (escape/) that points at that folder."""
    inst = make_install(tmp_path / "t", layout="plain")
    assert_clean(cli(*inst.args("apply")), allowed=(0,))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_bytes(VICTIM)
    (outside / "payload").write_bytes(PAYLOAD)
    (inst.comfy / "escape").symlink_to(outside, target_is_directory=True)
    return inst, outside


def real_state(inst) -> dict:
    return json.loads((inst.root / ".applier" / "state.json").read_text())


def as_format_1(inst, state: dict) -> dict:
    """Format 1 (before relative paths): every file entry also carries its absolute "path"."""
    state = json.loads(json.dumps(state))
    state["format"] = 1
    for rec in state["applied"].values():
        for f in rec["files"]:
            f.setdefault("path", str(inst.comfy / f["relpath"]))
            f.pop("root", None)
    return state


def rel(target: Path, start: Path) -> str:
    return os.path.relpath(target, start)


def nodes_entry(state: dict) -> dict:
    return state["applied"]["comfyui/maxres"]["files"][0]


def aim_at_victim(inst, outside, entry: dict) -> None:
    """Make revert's "restore the backup" branch fire on the victim: its current hash is the recorded "after",
    and the backup (rewritten with the payload) matches the recorded "before"."""
    entry["sha256_after"] = sha256(VICTIM)
    entry["sha256_before"] = sha256(PAYLOAD)
    (inst.root / ".applier" / entry["backup"]).write_bytes(PAYLOAD)


def craft_f1_abs_path(inst, outside, state):
    state = as_format_1(inst, state)
    entry = nodes_entry(state)
    entry["path"] = str(outside / "victim.py")
    aim_at_victim(inst, outside, entry)
    return state


def craft_f1_dotdot(inst, outside, state):
    state = as_format_1(inst, state)
    entry = nodes_entry(state)
    entry["path"] = str(outside / "victim.py")
    entry["relpath"] = rel(outside / "victim.py", inst.comfy)
    aim_at_victim(inst, outside, entry)
    return state


def craft_f2_dotdot(inst, outside, state):
    entry = nodes_entry(state)
    entry["relpath"] = rel(outside / "victim.py", inst.comfy)
    aim_at_victim(inst, outside, entry)
    return state


def craft_f2_absolute(inst, outside, state):
    entry = nodes_entry(state)
    entry["relpath"] = str(outside / "victim.py")
    aim_at_victim(inst, outside, entry)
    return state


def backup_of(relpath: str) -> str:
    return f"backups/comfyui/maxres/comfyui/{relpath}"


def craft_f2_symlinked_folder(inst, outside, state):
    entry = nodes_entry(state)
    entry["relpath"] = "escape/victim.py"
    entry["backup"] = backup_of("escape/victim.py")
    (inst.root / ".applier" / entry["backup"]).parent.mkdir(parents=True)
    aim_at_victim(inst, outside, entry)
    return state


def link_nodes_py_outside(inst, outside):
    """The attacker swaps the patched nodes.py for a link to the victim: a path every check of the text allows."""
    (inst.comfy / "nodes.py").unlink()
    (inst.comfy / "nodes.py").symlink_to(outside / "victim.py")


def craft_f2_symlinked_file(inst, outside, state):
    link_nodes_py_outside(inst, outside)
    aim_at_victim(inst, outside, nodes_entry(state))
    return state


def craft_f2_backup_escape(inst, outside, state):
    entry = nodes_entry(state)
    entry["backup"] = rel(outside / "payload", inst.root / ".applier")
    entry["sha256_before"] = sha256(PAYLOAD)
    return state


def craft_f1_backup_escape(inst, outside, state):
    return craft_f2_backup_escape(inst, outside, as_format_1(inst, state))


def craft_f2_not_in_catalog(inst, outside, state):
    entry = nodes_entry(state)
    entry["relpath"] = "comfyui_version.py"
    entry["backup"] = backup_of("comfyui_version.py")
    entry["sha256_after"] = sha256((inst.comfy / "comfyui_version.py").read_bytes())
    entry["sha256_before"] = sha256(PAYLOAD)
    (inst.root / ".applier" / entry["backup"]).write_bytes(PAYLOAD)
    return state


def craft_f2_unknown_component(inst, outside, state):
    state["applied"]["comfyui/maxres"]["component"] = "../outside"
    return state


STATE_ATTACKS = {
    "f1-dotdot-relpath": craft_f1_dotdot,
    "f2-dotdot-relpath": craft_f2_dotdot,
    "f2-absolute-relpath": craft_f2_absolute,
    "f2-symlinked-folder-out-of-the-tree": craft_f2_symlinked_folder,
    "f2-symlinked-file-out-of-the-tree": craft_f2_symlinked_file,
    "f2-backup-outside": craft_f2_backup_escape,
    "f1-backup-outside": craft_f1_backup_escape,
    "f2-relpath-no-patch-touches": craft_f2_not_in_catalog,
    "f2-unknown-component": craft_f2_unknown_component,
}


@pytest.mark.parametrize("attack", list(STATE_ATTACKS))
def test_a_crafted_state_is_refused_and_nothing_is_written(attacked, attack):
    inst, outside = attacked
    state = STATE_ATTACKS[attack](inst, outside, real_state(inst))
    (inst.root / ".applier" / "state.json").write_text(json.dumps(state, indent=2))
    tree, saved_state = snapshot(inst.root), state_files(inst)
    for command in ("status", "revert"):
        out = cli(*inst.args(command))
        assert_clean(out, allowed=(7,))
        assert (outside / "victim.py").read_bytes() == VICTIM, f"{command} overwrote a file outside the target"
        assert (outside / "payload").read_bytes() == PAYLOAD
        assert snapshot(inst.root) == tree, f"{command} changed the tree"
        assert state_files(inst) == saved_state, f"{command} changed .applier/"


def test_a_format_1_absolute_path_outside_is_never_used(attacked):
    """Format 1 carried an absolute "path" beside "relpath": it is ignored (relpath decides) or refused, never
    written to."""
    inst, outside = attacked
    state = craft_f1_abs_path(inst, outside, real_state(inst))
    (inst.root / ".applier" / "state.json").write_text(json.dumps(state, indent=2))
    for command in ("status", "revert"):
        out = assert_clean(cli(*inst.args(command)), allowed=(0, 5, 7))
        assert (outside / "victim.py").read_bytes() == VICTIM, f"{command} overwrote a file outside the target:\n{out}"
        nodes = (inst.comfy / "nodes.py").read_bytes()
        assert nodes in (PATCHED["nodes.py"], NODES_PY.encode()), f"{command} wrote the payload: {out}"


# ------------------------------------------------------------------------------------------ crafted journal.json

def journal_entry(fmt: int, inst, outside, **where) -> dict:
    entry = {"old_sha256": sha256(VICTIM), "new_sha256": sha256(PAYLOAD), "old_bytes": "0000.old",
             "new_bytes": "0000.new"}
    if fmt == 1:
        entry.update(path=str(outside / "victim.py"), like=None)
    else:
        entry.update(root="comfyui", relpath=rel(outside / "victim.py", inst.comfy), like=None)
    entry.update(where)
    return entry


def write_journal(inst, fmt: int, files: list, state_after: dict) -> None:
    data = inst.root / ".applier" / "journal-data"
    data.mkdir(exist_ok=True)
    (data / "0000.old").write_bytes(VICTIM)
    (data / "0000.new").write_bytes(PAYLOAD)
    journal = {"format": fmt, "what": "a crafted run", "started": "2026-01-01T00:00:00+0000", "files": files,
               "state_after": state_after}
    (inst.root / ".applier" / "journal.json").write_text(json.dumps(journal, indent=2))


def jour_f1_absolute(inst, outside):
    write_journal(inst, 1, [journal_entry(1, inst, outside)], as_format_1(inst, real_state(inst)))


def jour_f2_dotdot(inst, outside):
    write_journal(inst, 2, [journal_entry(2, inst, outside)], real_state(inst))


def jour_f2_absolute(inst, outside):
    write_journal(inst, 2, [journal_entry(2, inst, outside, relpath=str(outside / "victim.py"))], real_state(inst))


def jour_f2_symlinked_folder(inst, outside):
    write_journal(inst, 2, [journal_entry(2, inst, outside, relpath="escape/victim.py")], real_state(inst))


def jour_f2_symlinked_file(inst, outside):
    link_nodes_py_outside(inst, outside)
    write_journal(inst, 2, [journal_entry(2, inst, outside, relpath="nodes.py")], real_state(inst))


def jour_f2_unknown_root(inst, outside):
    write_journal(inst, 2, [journal_entry(2, inst, outside, root="outside", relpath="victim.py")], real_state(inst))


def jour_f2_blob_outside(inst, outside):
    nodes = (inst.comfy / "nodes.py").read_bytes()
    write_journal(inst, 2, [journal_entry(2, inst, outside, relpath="nodes.py", old_sha256=sha256(nodes),
                                          new_bytes=rel(outside / "payload", inst.root / ".applier" / "journal-data"))],
                  real_state(inst))


def jour_f2_like_outside(inst, outside):
    write_journal(inst, 2, [journal_entry(2, inst, outside, relpath="new_file.py", old_sha256=None, old_bytes=None,
                                          like={"root": "comfyui",
                                                "relpath": rel(outside / "victim.py", inst.comfy)})],
                  real_state(inst))


def jour_f2_state_after_outside(inst, outside):
    state = real_state(inst)
    entry = nodes_entry(state)
    entry["relpath"] = rel(outside / "victim.py", inst.comfy)
    aim_at_victim(inst, outside, entry)
    write_journal(inst, 2, [], state)


JOURNAL_ATTACKS = {
    "f1-absolute-path": jour_f1_absolute,
    "f2-dotdot-relpath": jour_f2_dotdot,
    "f2-absolute-relpath": jour_f2_absolute,
    "f2-symlinked-folder-out-of-the-tree": jour_f2_symlinked_folder,
    "f2-symlinked-file-out-of-the-tree": jour_f2_symlinked_file,
    "f2-unknown-root": jour_f2_unknown_root,
    "f2-blob-outside": jour_f2_blob_outside,
    "f2-like-outside": jour_f2_like_outside,
    "f2-state-after-outside": jour_f2_state_after_outside,
}


@pytest.mark.parametrize("attack", list(JOURNAL_ATTACKS))
def test_a_crafted_journal_is_refused_by_status_and_nothing_is_written(attacked, attack):
    inst, outside = attacked
    JOURNAL_ATTACKS[attack](inst, outside)
    tree = snapshot(inst.root)
    for command in ("status", "revert"):
        out = cli(*inst.args(command))
        assert_clean(out, allowed=(7,))
        assert (outside / "victim.py").read_bytes() == VICTIM, f"{command} overwrote a file outside the target"
        assert (outside / "payload").read_bytes() == PAYLOAD
        assert snapshot(inst.root) == tree, f"{command} changed the tree"
    after = json.loads((inst.root / ".applier" / "state.json").read_text())
    assert not any(".." in f["relpath"] for r in after["applied"].values() for f in r["files"])


# ------------------------------------------------------------------------------------------ a catalog writing .applier/

EVIL_DIFFS = {
    "new-file-in-applier": "--- /dev/null\n+++ b/.applier/evil.json\n@@ -0,0 +1 @@\n+{}\n",
    "dot-slash": "--- /dev/null\n+++ b/./.applier/evil.json\n@@ -0,0 +1 @@\n+{}\n",
    "state-json-edit": ("--- a/.applier/state.json\n+++ b/.applier/state.json\n@@ -1,2 +1,2 @@\n {\n"
                        "-  \"format\": 2,\n+  \"format\": 2, \"evil\": true,\n"),
    "symlink-to-applier": "--- /dev/null\n+++ b/cfg/evil.json\n@@ -0,0 +1 @@\n+{}\n",
}


@pytest.mark.parametrize("case", list(EVIL_DIFFS))
def test_a_catalog_diff_into_applier_is_refused(tmp_path, case):
    inst = make_install(tmp_path / "t", layout="plain")
    catalog = tmp_path / "patches-copy"
    shutil.copytree(REPO / "patches", catalog)
    for child in inst.catalog.iterdir():          # the test patches beside the shipped ones
        shutil.copytree(child, catalog / child.name, dirs_exist_ok=True)
    write_patch(catalog, "comfyui/evil", [("all", ">=0", EVIL_DIFFS[case])], default=False)
    assert_clean(cli("apply", "--target", inst.root, "--patches", catalog, "--only", "comfyui/maxres"),
                 allowed=(0,))
    (inst.comfy / "cfg").symlink_to(".applier", target_is_directory=True)
    tree, saved_state = snapshot(inst.root), state_files(inst)
    out = cli("apply", "--target", inst.root, "--patches", catalog, "--only", "comfyui/evil")
    assert_clean(out, allowed=(3,))
    assert state_files(inst) == saved_state, f".applier/ changed:\n{out}"
    assert snapshot(inst.root) == tree
