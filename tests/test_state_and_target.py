"""One install, one state, confined to the install: where .applier/ lives whatever --target names, what it may
name, and the frictions of the day after (a lost patch no variant fits, a deleted file, a bad --python)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from applier.cli import cli
from applier.detect import detect
from fixtures.comfy_tree import build_comfy_tree
from shelltools import MAXRES_DIFF, REPO, cli_json, make_catalog, make_comfy, run_cli, tree_bytes, write_patch


@pytest.fixture
def setup(tmp_path):
    return make_comfy(tmp_path), make_catalog(tmp_path)


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ one install, one state

def test_every_way_of_naming_an_install_leads_to_one_state(tmp_path):
    comfy = make_comfy(tmp_path)
    (comfy / "comfy" / "ldm").mkdir(parents=True)
    for given in (comfy, tmp_path, comfy / "comfy" / "ldm"):
        found = detect(given, gpu=False)
        assert found.root == comfy.resolve() and found.state_dir == comfy.resolve() / ".applier", given


def test_a_portable_install_keeps_its_state_in_the_outer_folder(tmp_path):
    outer = tmp_path / "ComfyUI_windows_portable"
    comfy = make_comfy(outer)
    (outer / "python_embeded" / "Lib" / "site-packages").mkdir(parents=True)
    (comfy / "custom_nodes").mkdir()
    for given in (outer, comfy, comfy / "custom_nodes"):
        found = detect(given, gpu=False)
        assert (found.root, found.comfyui_root, found.layout) == (outer.resolve(), comfy.resolve(), "portable")


def test_apply_through_the_parent_folder_writes_the_install_state(setup, tmp_path):
    comfy, catalog = setup
    run_cli("apply", "--target", str(tmp_path), "--patches", str(catalog), check=True)
    assert (comfy / ".applier" / "state.json").exists() and not (tmp_path / ".applier").exists()
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0 and {p["state"] for p in out["patches"]} == {"applied"}
    assert all(p["recorded"] for p in out["patches"])
    (comfy / "comfy").mkdir()
    run_cli("revert", "--target", str(comfy / "comfy"), "--patches", str(catalog), check=True)
    assert b"MAX_RESOLUTION=16384" in (comfy / "nodes.py").read_bytes()


def test_a_state_an_older_applier_left_in_the_parent_folder_is_pointed_out(setup, tmp_path):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    shutil.move(comfy / ".applier", tmp_path / ".applier")      # where applier 0.1 wrote it for --target tmp_path
    before = tree_bytes(comfy)
    proc = run_cli("status", "--target", str(tmp_path), "--patches", str(catalog))
    assert proc.returncode == 9 and f"mv {tmp_path / '.applier'} {comfy / '.applier'}" in proc.stderr
    assert tree_bytes(comfy) == before


# ------------------------------------------------------------------ confinement (fast cases; tests/reliability has more)

def test_revert_on_a_copied_install_restores_the_copy_and_leaves_the_original(setup, tmp_path):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    patched = tree_bytes(comfy)
    copy = tmp_path / "copy" / "ComfyUI"
    shutil.copytree(comfy, copy, symlinks=True)
    run_cli("revert", "--target", str(copy), "--patches", str(catalog), check=True)
    assert b"MAX_RESOLUTION=16384" in (copy / "nodes.py").read_bytes()
    assert tree_bytes(comfy) == patched


@pytest.mark.parametrize("relpath", ["../outside.py", "/etc/hostname", "sub/../../outside.py", ".applier/state.json",
                                     "main.py"])
def test_a_crafted_state_path_is_refused_and_nothing_is_written(setup, tmp_path, relpath):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    outside = tmp_path / "outside.py"
    outside.write_text("precious\n")
    state_file = comfy / ".applier" / "state.json"
    state = json.loads(state_file.read_text())
    state["applied"]["comfyui/maxres"]["files"][0]["relpath"] = relpath
    state_file.write_text(json.dumps(state))
    before = tree_bytes(tmp_path)
    for command in ("revert", "status", "apply"):
        proc = run_cli(command, "--target", str(comfy), "--patches", str(catalog))
        assert proc.returncode == 7, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert tree_bytes(tmp_path) == before


def test_a_state_of_a_newer_format_names_the_applier_that_wrote_it_and_nothing_is_written(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    state_file = comfy / ".applier" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["applier_version"]                         # every state records the applier that wrote it
    for recorded, said in (("9.1.0", "a newer applier (applier 9.1.0, format 99)"),
                           (None, "a newer applier (format 99)")):     # an older writer recorded none
        state.update(format=99, applier_version=recorded)
        state_file.write_text(json.dumps({k: v for k, v in state.items() if v is not None}))
        before = tree_bytes(comfy)
        proc = run_cli("status", "--target", str(comfy), "--patches", str(catalog))
        assert proc.returncode == 7 and said in proc.stderr, proc.stderr
        assert "unknown format" not in proc.stderr and "Traceback" not in proc.stderr
        assert tree_bytes(comfy) == before


def test_a_symlink_planted_in_place_of_a_patched_file_is_refused(setup, tmp_path):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    outside = tmp_path / "outside.py"
    outside.write_text("precious\n")
    (comfy / "nodes.py").unlink()
    (comfy / "nodes.py").symlink_to(outside)
    proc = run_cli("revert", "--target", str(comfy), "--patches", str(catalog), "--force")
    assert proc.returncode == 7 and "outside" in proc.stderr
    assert outside.read_text() == "precious\n"


def test_a_crafted_journal_cannot_make_status_write_outside(setup, tmp_path):
    comfy, catalog = setup
    outside = tmp_path / "outside.py"
    outside.write_text("precious\n")
    store = comfy / ".applier"
    (store / "journal-data").mkdir(parents=True)
    (store / "journal-data" / "0000.new").write_bytes(b"owned\n")
    entry = {"path": str(outside), "old_sha256": sha(outside),
             "new_sha256": hashlib.sha256(b"owned\n").hexdigest(), "old_bytes": None, "new_bytes": "0000.new"}
    (store / "journal.json").write_text(json.dumps({"format": 1, "files": [entry],
                                                    "state_after": {"format": 2, "applied": {}}}))
    proc = run_cli("status", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 7 and "Traceback" not in proc.stderr
    assert outside.read_text() == "precious\n"


@pytest.mark.parametrize("name", ["\ud800", "0000.new\n", "..", "a b", "0000.new/"])
def test_a_journal_naming_a_blob_no_file_can_have_is_refused_not_a_traceback(setup, name):
    """A blob name of journal-data/ is a plain ASCII name (applier writes 0000.old / 0000.new): a lone surrogate,
    which no file system name can hold, once reached the read as an exception of its own (found by fuzzing)."""
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    store = comfy / ".applier"
    (store / "journal-data").mkdir()
    (store / "journal-data" / "0000.new").write_bytes(b"x\n")
    entry = {"root": "comfyui", "relpath": "nodes.py", "old_sha256": sha(comfy / "nodes.py"),
             "new_sha256": hashlib.sha256(b"x\n").hexdigest(), "old_bytes": None, "new_bytes": name}
    (store / "journal.json").write_text(json.dumps({"format": 2, "files": [entry],
                                                    "state_after": {"format": 2, "applied": {}}}))
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 7 and "Traceback" not in proc.stderr, proc.stderr
    assert tree_bytes(comfy) == before


def test_a_catalog_diff_into_the_state_folder_is_refused(setup, tmp_path):
    comfy, _ = setup
    catalog = tmp_path / "evil"
    write_patch(catalog, "comfyui/evil", [("all", ">=0", "--- /dev/null\n+++ b/.applier/state.json\n@@ -0,0 +1 @@\n+{}\n")])
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3 and ".applier" in proc.stderr
    assert not (comfy / ".applier" / "state.json").exists()


def test_stray_temp_files_of_a_killed_write_are_removed_by_status(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    marker = "applier-" + "0123456789abcdef" * 2      # the shape every temp file of a run carries
    stray = [comfy / f".nodes.py.{marker}.applier-tmp", comfy / ".applier" / f".state.json.{marker}.applier-tmp"]
    theirs = [comfy / ".nodes.py.k3j2h1.applier-tmp", comfy / ".notes.applier-tmp"]   # a user's, named alike
    for path in stray + theirs:
        path.write_bytes(b"half")
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0 and "temp file" in out["recovered"]
    assert not any(path.exists() for path in stray)
    assert all(path.read_bytes() == b"half" for path in theirs)


def test_a_symlinked_file_stays_a_symlink_through_apply_and_revert(setup):
    comfy, catalog = setup
    (comfy / "real").mkdir()
    shutil.move(comfy / "nodes.py", comfy / "real" / "nodes.py")
    (comfy / "nodes.py").symlink_to("real/nodes.py")
    original = (comfy / "real" / "nodes.py").read_bytes()
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (comfy / "nodes.py").is_symlink() and b"40960" in (comfy / "real" / "nodes.py").read_bytes()
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (comfy / "nodes.py").is_symlink() and (comfy / "real" / "nodes.py").read_bytes() == original


# ------------------------------------------------------------------ the day after

def test_a_deleted_file_never_blocks_status_or_revert_of_the_others(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    (comfy / "execution.py").unlink()
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 5 and {p["id"]: p["state"] for p in out["patches"]}["comfyui/exec"] == "lost"
    code, out = cli_json("revert", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert b"MAX_RESOLUTION=16384" in (comfy / "nodes.py").read_bytes()


def test_a_lost_patch_no_variant_fits_gives_one_advice_and_apply_does_not_exit_0(tmp_path):
    comfy = make_comfy(tmp_path, version="0.3.60")
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/maxres", [("old", "<0.3.65", MAXRES_DIFF)])
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    # an update: a new version whose nodes.py no variant's text fits
    (comfy / "comfyui_version.py").write_text('__version__ = "0.3.66"\n')
    (comfy / "nodes.py").write_text("MAX_RESOLUTION = 16384  # new layout\n")
    clear = f"applier revert --target {comfy.resolve()} --only comfyui/maxres --forget"
    code, status = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 5 and clear in status["patches"][0]["reason"]
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 5 and out["stale"] and clear in out["stale"][0]["advice"]
    updated = tree_bytes(comfy)
    run_cli(*clear.split()[1:], "--patches", str(catalog), check=True)
    assert tree_bytes(comfy) == updated                  # the update's files stay as they are
    assert run_cli("status", "--target", str(comfy), "--patches", str(catalog)).returncode == 0
    assert list((comfy / ".applier" / "displaced").rglob("nodes.py"))   # the old original is kept


def test_python_that_is_not_an_interpreter_is_a_bad_target(setup, tmp_path):
    comfy, catalog = setup
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    for args in (("detect",), ("apply", "--patches", str(catalog))):
        proc = run_cli(args[0], "--target", str(comfy), "--python", str(fake), *args[1:])
        assert proc.returncode == 9 and "not a usable Python interpreter" in proc.stderr


def test_an_unknown_patch_id_is_exit_3_in_every_command(setup):
    comfy, catalog = setup
    for args in (("apply", "--target", str(comfy), "--only", "comfyui/nope"),
                 ("revert", "--target", str(comfy), "--only", "comfyui/nope"),
                 ("status", "--target", str(comfy), "--only", "comfyui/nope"),
                 ("explain", "comfyui/nope")):
        proc = run_cli(*args, "--patches", str(catalog))
        assert proc.returncode == 3 and "no patch 'comfyui/nope'" in proc.stderr, args


def test_status_only_reports_the_named_patches(setup):
    comfy, catalog = setup
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/exec")
    assert code == 0 and [p["id"] for p in out["patches"]] == ["comfyui/exec"]


def test_the_apply_report_says_applied_and_a_revert_dry_run_says_would_restore(setup):
    comfy, catalog = setup
    out = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True).stdout
    assert "hunk #1: applied at line" in out and "not-applied" not in out
    out = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--dry-run").stdout
    assert "already applied at line" in out
    out = run_cli("revert", "--target", str(comfy), "--patches", str(catalog), "--dry-run", check=True).stdout
    assert "would restore" in out and "    restored" not in out
    assert b"40960" in (comfy / "nodes.py").read_bytes()


def test_no_color_is_honoured(setup):
    comfy, catalog = setup
    runner = CliRunner()
    args = ["status", "--target", str(comfy), "--patches", str(catalog)]
    assert "\x1b[" in runner.invoke(cli, args, color=True, env={"NO_COLOR": ""}).output
    assert "\x1b[" not in runner.invoke(cli, args, color=True, env={"NO_COLOR": "1"}).output


def test_a_full_revert_leaves_only_the_lock_and_gitignore_and_clean_removes_the_folder(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert sorted(p.name for p in (comfy / ".applier").iterdir()) == [".gitignore", "lock"]
    proc = run_cli("clean", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert not (comfy / ".applier").exists() and "removed" in proc.stdout
    proc = run_cli("clean", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert "nothing to clean" in proc.stdout and "removed" not in proc.stdout


def test_clean_refuses_while_patches_are_applied(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    proc = run_cli("clean", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3 and "revert" in proc.stderr
    assert (comfy / ".applier" / "state.json").exists()


def test_output_closed_early_is_not_a_traceback(setup):
    comfy, catalog = setup
    env = {**os.environ, "PYTHONPATH": str(REPO), "APPLIER_NO_GPU_PROBE": "1"}
    proc = subprocess.run(f"{sys.executable} -m applier list --target {comfy} --patches {catalog} | head -c1",
                          shell=True, capture_output=True, text=True, env=env)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr



def test_a_second_apply_on_a_versionless_tree_is_already_applied(tmp_path):
    # 2024-08: no version file; once patched, two eras' max-resolution diffs share the post-image (40960): the
    # recorded variant decides, not a dry run that finds both clean.
    comfy = build_comfy_tree(tmp_path / "t", era="2024-08", layout="plain")
    run_cli("apply", "--target", str(comfy), check=True)
    once = tree_bytes(comfy)
    code, out = cli_json("apply", "--target", str(comfy))
    assert code == 0, out
    assert {p["action"] for p in out["patches"]} <= {"already-applied", "not-applicable"}
    assert tree_bytes(comfy) == once
