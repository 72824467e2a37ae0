"""apply / status / revert through the CLI, as a user runs them: all-or-nothing, idempotent, byte-identical."""
from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from shelltools import (EXEC_DIFF, MAXRES_DIFF, REPO, cli_json, make_catalog, make_comfy, run_cli, run_git,
                        tree_bytes, write_patch)


@pytest.fixture
def setup(tmp_path):
    return make_comfy(tmp_path), make_catalog(tmp_path)


def test_apply_then_revert_restores_every_byte(setup):
    comfy, catalog = setup
    before = tree_bytes(comfy)
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert {p["id"]: p["action"] for p in out["patches"]} == {"comfyui/exec": "apply", "comfyui/maxres": "apply"}
    assert b"MAX_RESOLUTION=40960" in (comfy / "nodes.py").read_bytes()
    hunks = out["patches"][1]["files"][0]["hunks"]
    assert hunks[0]["line"] == 2 and hunks[0]["state"] == "not-applied"
    code, out = cli_json("revert", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert tree_bytes(comfy) == before


def test_second_apply_reports_already_applied_and_changes_nothing(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    once = tree_bytes(comfy)
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0
    assert {p["action"] for p in out["patches"]} == {"already-applied"}
    assert tree_bytes(comfy) == once


def test_a_conflict_in_one_patch_leaves_every_file_untouched(setup):
    comfy, catalog = setup
    (comfy / "execution.py").write_text("def execute(node):\n    return node(retry=False)\n")
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "execution.py" in proc.stderr and "hunk #1" in proc.stderr and "expected" in proc.stderr
    assert tree_bytes(comfy) == before
    assert not (comfy / ".applier" / "state.json").exists()


def test_dry_run_writes_nothing(setup):
    comfy, catalog = setup
    before = tree_bytes(comfy)
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--dry-run")
    assert code == 0 and out["dry_run"] is True
    assert tree_bytes(comfy) == before


@pytest.mark.parametrize("command", [("accept", "--only", "comfyui/maxres"), ("revert",),
                                     ("revert", "--only", "comfyui/maxres"), ("clean",)])
def test_a_command_on_an_install_with_nothing_recorded_creates_nothing(setup, command):
    """The install is opened for a run only where .applier/ exists: a refusal or a no-op on a fresh install leaves
    no state folder behind (accept created one before refusing)."""
    comfy, catalog = setup
    before = tree_bytes(comfy)
    proc = run_cli(*command, "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr      # done, or refused (nothing recorded)
    assert not (comfy / ".applier").exists()
    assert tree_bytes(comfy) == before


def test_only_and_skip_select_patches(setup):
    comfy, catalog = setup
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres")
    assert [p["id"] for p in out["patches"]] == ["comfyui/maxres"]
    assert b"retried" not in (comfy / "execution.py").read_bytes()
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/nope")
    assert proc.returncode == 3 and "no patch 'comfyui/nope'" in proc.stderr
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--skip", "comfyui/exec")
    assert [p["id"] for p in out["patches"]] == ["comfyui/maxres"]


def test_two_patches_on_one_file_stack_and_revert_separately(tmp_path):
    comfy = make_comfy(tmp_path)
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/a-maxres", [("all", ">=0", MAXRES_DIFF)])
    write_patch(catalog, "comfyui/b-pil", [("all", ">=0", """\
--- a/nodes.py
+++ b/nodes.py
@@ -1,2 +1,3 @@
 import os
+import sys
 
""")])
    original = (comfy / "nodes.py").read_bytes()
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    both = (comfy / "nodes.py").read_bytes()
    assert b"import sys" in both and b"40960" in both
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert {p["id"]: p["state"] for p in out["patches"]} == {"comfyui/a-maxres": "applied", "comfyui/b-pil": "applied"}
    # revert the one underneath: only its hunk goes, the other patch stays
    code, out = cli_json("revert", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/a-maxres")
    assert code == 0, out
    now = (comfy / "nodes.py").read_bytes()
    assert b"import sys" in now and b"MAX_RESOLUTION=16384" in now
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (comfy / "nodes.py").read_bytes() == original


def test_revert_refuses_a_file_edited_over_the_patch_and_force_saves_it(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres", check=True)
    mine = "import os\n\nMAX_RESOLUTION=65536  # mine\n\nclass EmptyLatentImage: pass\n"
    (comfy / "nodes.py").write_text(mine)
    proc = run_cli("revert", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 5 and "nodes.py" in proc.stderr
    assert (comfy / "nodes.py").read_text() == mine
    code, out = cli_json("revert", "--target", str(comfy), "--patches", str(catalog), "--force")
    assert code == 0, out
    assert (comfy / "nodes.py").read_text() == NODES_ORIGINAL(comfy)
    saved = list((comfy / ".applier" / "displaced").rglob("nodes.py"))
    assert len(saved) == 1 and saved[0].read_text() == mine


def NODES_ORIGINAL(comfy):
    from shelltools import NODES_PY
    return NODES_PY


def test_revert_keeps_other_edits_when_the_patched_region_is_intact(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres", check=True)
    (comfy / "nodes.py").write_text((comfy / "nodes.py").read_text() + "# my own line\n")
    code, out = cli_json("revert", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    text = (comfy / "nodes.py").read_text()
    assert "MAX_RESOLUTION=16384" in text and "# my own line" in text


def test_status_reports_lost_after_an_update_and_apply_reapplies(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres", check=True)
    # an update rewrites nodes.py with a newer upstream text, without the patch
    (comfy / "nodes.py").write_text("import os\nimport json\n\nMAX_RESOLUTION=16384\n\nclass EmptyLatentImage: pass\n")
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 5 and out["drift"] is True
    assert {p["id"]: p["state"] for p in out["patches"]}["comfyui/maxres"] == "lost"
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres")
    assert code == 0 and out["patches"][0]["action"] == "apply"
    assert b"MAX_RESOLUTION=40960" in (comfy / "nodes.py").read_bytes()
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert {p["id"]: p["state"] for p in out["patches"]}["comfyui/maxres"] == "applied"


def test_status_reports_modified_when_the_patched_file_was_edited(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    (comfy / "nodes.py").write_text((comfy / "nodes.py").read_text() + "# edit\n")
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 5
    assert {p["id"]: p["state"] for p in out["patches"]}["comfyui/maxres"] == "modified"


def test_mode_is_kept_and_stale_bytecode_removed(setup):
    comfy, catalog = setup
    os.chmod(comfy / "nodes.py", 0o640)
    cache = comfy / "__pycache__"
    cache.mkdir()
    (cache / "nodes.cpython-311.pyc").write_bytes(b"stale")
    (cache / "execution.cpython-311.pyc").write_bytes(b"stale")
    (cache / "other.cpython-311.pyc").write_bytes(b"keep")
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres", check=True)
    assert stat.S_IMODE((comfy / "nodes.py").stat().st_mode) == 0o640
    assert not (cache / "nodes.cpython-311.pyc").exists()
    assert (cache / "execution.cpython-311.pyc").exists() and (cache / "other.cpython-311.pyc").exists()


def test_revert_restores_the_bytes_and_removes_the_patched_module_s_bytecode_as_readme_says(setup):
    """README: `revert` is byte-identical for the files, and by design deletes the .pyc of each module it rewrites."""
    comfy, catalog = setup
    original = (comfy / "nodes.py").read_bytes()
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres", check=True)
    cache = comfy / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "nodes.cpython-311.pyc").write_bytes(b"the patched module's bytecode")
    (cache / "other.cpython-311.pyc").write_bytes(b"keep")
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (comfy / "nodes.py").read_bytes() == original
    assert not (cache / "nodes.cpython-311.pyc").exists() and (cache / "other.cpython-311.pyc").exists()
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "by design `revert`, like `apply`, also deletes the bytecode (`__pycache__/<module>.*.pyc`)" in readme


def test_a_hardlinked_file_is_replaced_not_written_in_place(setup, tmp_path):
    comfy, catalog = setup
    cache_copy = tmp_path / "uv-cache-nodes.py"
    os.link(comfy / "nodes.py", cache_copy)
    original = cache_copy.read_bytes()
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/maxres")
    assert code == 0
    assert any("hard links" in w for w in out["warnings"])
    assert cache_copy.read_bytes() == original          # the other link still holds the original
    assert b"40960" in (comfy / "nodes.py").read_bytes()


def test_state_folder_is_kept_out_of_git_without_writing_into_git(tmp_path):
    comfy = make_comfy(tmp_path, git=True)
    catalog = make_catalog(tmp_path)
    exclude = comfy / ".git" / "info" / "exclude"
    before = exclude.read_bytes() if exclude.exists() else None
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (exclude.read_bytes() if exclude.exists() else None) == before      # .git is never written
    assert (comfy / ".applier" / ".gitignore").read_text().splitlines()[-1] == "*"
    porcelain = run_git(comfy, "status", "--porcelain")
    assert ".applier" not in porcelain and "nodes.py" in porcelain


def test_state_is_plain_json_a_person_can_read(setup):
    comfy, catalog = setup
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    state = json.loads((comfy / ".applier" / "state.json").read_text())
    rec = state["applied"]["comfyui/maxres"]
    assert rec["variant"] == "all" and rec["component_version"] == "0.3.60"
    f = rec["files"][0]
    assert f["relpath"] == "nodes.py" and len(f["sha256_before"]) == 64
    assert (comfy / ".applier" / f["backup"]).read_text().startswith("import os")
    assert not (comfy / ".applier" / "journal.json").exists()


def test_corrupt_state_file_is_a_clear_error_and_changes_nothing(setup):
    comfy, catalog = setup
    (comfy / ".applier").mkdir()
    (comfy / ".applier" / "state.json").write_text("{not json")
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 7 and "state.json" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_bytes(comfy) == before


def test_version_picks_the_variant_and_no_variant_is_not_applicable(tmp_path):
    comfy = make_comfy(tmp_path, version="0.3.10")
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/maxres", [("old", "<0.3.48", MAXRES_DIFF), ("new", ">=0.3.48", "--- a/x\n+++ b/x\n")])
    write_patch(catalog, "comfyui/exec", [("new", ">=0.3.50", EXEC_DIFF)])
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--dry-run")
    plans = {p["id"]: p for p in out["patches"]}
    assert plans["comfyui/maxres"]["variant"] == "old" and plans["comfyui/maxres"]["action"] == "apply"
    assert plans["comfyui/exec"]["action"] == "not-applicable" and "0.3.10" in plans["comfyui/exec"]["reason"]
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/exec")
    assert proc.returncode == 3 and "no variant" in proc.stderr


def test_unknown_version_is_served_by_the_one_clean_dry_run(tmp_path):
    comfy = make_comfy(tmp_path, version=None)
    catalog = tmp_path / "catalog"
    other = MAXRES_DIFF.replace("16384", "8192")
    write_patch(catalog, "comfyui/maxres", [("8192-era", "<0.0.1", other), ("16384-era", "<0.0.1", MAXRES_DIFF)])
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert out["patches"][0]["variant"] == "16384-era" and "only variant" in out["patches"][0]["reason"]


def test_unknown_version_with_two_clean_variants_is_refused(tmp_path):
    comfy = make_comfy(tmp_path, version=None)
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/maxres", [("a", "<0.0.1", MAXRES_DIFF), ("b", "<0.0.1", MAXRES_DIFF)])
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3 and "refusing to guess" in proc.stderr
    assert tree_bytes(comfy) == before


def test_permission_denied_changes_nothing(setup):
    comfy, catalog = setup
    target_file = comfy / "nodes.py"   # the second file written: the first must be rolled back
    if subprocess.run(["chattr", "+i", str(target_file)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (root bypasses plain mode bits)")
    try:
        before = tree_bytes(comfy)
        proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
        assert proc.returncode == 8, proc.stdout + proc.stderr
        assert "nodes.py" in proc.stderr and "not permitted" in proc.stderr
        assert tree_bytes(comfy) == before   # execution.py (written first) was rolled back
    finally:
        subprocess.run(["chattr", "-i", str(target_file)])


def test_fuzz_is_used_only_when_asked_and_remembered_for_revert(tmp_path):
    comfy = make_comfy(tmp_path)
    catalog = tmp_path / "catalog"
    # the diff's leading context line differs from the file: it only fits when one context line may be ignored
    write_patch(catalog, "comfyui/maxres", [("all", ">=0", MAXRES_DIFF.replace("@@\n \n-MAX", "@@\n #ctx\n-MAX"))])
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3 and tree_bytes(comfy) == before
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--fuzz", "1")
    assert code == 0, out
    assert out["patches"][0]["files"][0]["hunks"][0]["fuzz"] == 1
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert out["patches"][0]["state"] == "applied"
    (comfy / "nodes.py").write_text((comfy / "nodes.py").read_text() + "# edit\n")
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert "MAX_RESOLUTION=16384" in (comfy / "nodes.py").read_text()


def test_a_claimed_variant_that_does_not_fit_falls_back_to_the_one_clean_dry_run(tmp_path):
    # ComfyUI's v0.3.44 tag: its version is claimed by the "async" variant, but its execution.py still has the
    # "sync" text (the call changed after the version bump)
    comfy = make_comfy(tmp_path, version="0.3.44")
    catalog = tmp_path / "catalog"
    other = MAXRES_DIFF.replace("16384", "8192")
    write_patch(catalog, "comfyui/maxres", [("claims-it", ">=0.3.44", other), ("older", "<0.3.44", MAXRES_DIFF)])
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    plan = out["patches"][0]
    assert plan["variant"] == "older"
    assert "claims-it" in plan["reason"] and "does not fit" in plan["reason"] and "dry run" in plan["reason"]
