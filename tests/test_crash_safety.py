"""Kill the process at every failpoint; the next command must leave each file fully original or fully patched,
and revert must then restore the original bytes. Plus the lock and path safety."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from applier.store import failpoints
from shelltools import REPO, cli_json, make_catalog, make_comfy, run_cli, tree_bytes, write_patch


def patched_or_original(comfy, before) -> str:
    now = tree_bytes(comfy)
    if now == before:
        return "original"
    nodes, execution = now["nodes.py"], now["execution.py"]
    assert b"MAX_RESOLUTION=40960" in nodes and b"retried once" in execution, "torn state: " + repr(now)
    return "patched"


@pytest.mark.parametrize("name", failpoints.NAMES)
def test_apply_killed_at_each_failpoint_recovers(tmp_path, name):
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), env={"APPLIER_FAILPOINT": name})
    assert proc.returncode == failpoints.EXIT_CODE, proc.stdout + proc.stderr
    code, status = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, status
    outcome = patched_or_original(comfy, before)
    states = {p["id"]: p["state"] for p in status["patches"]}
    expected = "applied" if outcome == "patched" else "not-applied"
    assert set(states.values()) == {expected}
    # a kill after the journal is committed is finished, never left half-done
    if name in ("after-first-file", "after-files", "after-state"):
        assert outcome == "patched"
    assert not (comfy / ".applier" / "journal.json").exists()
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert tree_bytes(comfy) == before


@pytest.mark.parametrize("name", failpoints.NAMES)
def test_revert_killed_at_each_failpoint_recovers(tmp_path, name):
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    before = tree_bytes(comfy)
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    proc = run_cli("revert", "--target", str(comfy), "--patches", str(catalog), env={"APPLIER_FAILPOINT": name})
    assert proc.returncode == failpoints.EXIT_CODE
    code, status = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, status
    patched_or_original(comfy, before)
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert tree_bytes(comfy) == before


def test_a_second_concurrent_run_waits_then_fails_clearly(tmp_path):
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; from applier.store.state import StateStore\n"
         "from applier.store.confine import Confinement; from pathlib import Path\n"
         f"d = Path({str(comfy / '.applier')!r})\n"
         "with StateStore(d, Confinement({}, d)).locked():\n"
         "    print('held', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree_bytes(comfy)
        start = time.monotonic()
        proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog),
                       env={"APPLIER_LOCK_TIMEOUT": "0.5"})
        assert proc.returncode == 4 and "another applier run holds the lock" in proc.stderr
        assert time.monotonic() - start < 20
        assert tree_bytes(comfy) == before
    finally:
        holder.kill()
        holder.wait()
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)


@pytest.mark.parametrize("path,words", [
    ("../outside.py", "'..'"),
    ("/etc/passwd", "absolute path"),
    ("sub/../../x.py", "'..'"),
])
def test_paths_leaving_the_component_root_are_refused(tmp_path, path, words):
    comfy = make_comfy(tmp_path)
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/evil", [("all", ">=0", f"--- {path}\n+++ {path}\n@@ -0,0 +1 @@\n+pwned\n")])
    before = tree_bytes(tmp_path)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert words in proc.stderr
    assert tree_bytes(tmp_path) == before


def test_a_symlink_escaping_the_root_is_refused(tmp_path):
    comfy = make_comfy(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("x = 1\n")
    (comfy / "linked").symlink_to(outside)
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/evil", [("all", ">=0", "--- a/linked/victim.py\n+++ b/linked/victim.py\n"
                                                        "@@ -1 +1 @@\n-x = 1\n+x = 2\n")])
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 3 and "symlink escape" in proc.stderr
    assert (outside / "victim.py").read_text() == "x = 1\n"


def test_verify_finishes_an_interrupted_apply_before_judging(tmp_path):
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog),
                   env={"APPLIER_FAILPOINT": "after-first-file"})
    assert proc.returncode == failpoints.EXIT_CODE
    code, report = cli_json("verify", "--target", str(comfy), "--patches", str(catalog), "--only", "integrity")
    assert code == 0, report
    assert not (comfy / ".applier" / "journal.json").exists()
    assert [c["outcome"] for c in report["checks"]] == ["PASS"]


def test_disk_full_while_backing_up_leaves_no_backup_and_no_journal(tmp_path, monkeypatch):
    """The journal writes a run's backups with the rest of the run: a failure among them removes the ones written,
    and nothing in the target or .applier/ says a run happened."""
    import errno

    from applier import operations
    from applier.catalog import load_catalog
    from applier.catalog.allowlist import install_for
    from applier.detect import detect
    from applier.errors import IOFailure
    from applier.store.heldroot import HeldRoot

    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    before = tree_bytes(comfy)
    real_write = HeldRoot.write
    backups = []

    def fill_the_disk_at_the_second_backup(self, rel, data, **kw):
        if self.path.name == ".applier" and str(rel).startswith("backups/"):
            backups.append(rel)
            if len(backups) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, rel, data, **kw)

    monkeypatch.setattr(HeldRoot, "write", fill_the_disk_at_the_second_backup)
    patches = load_catalog(catalog)
    with pytest.raises(IOFailure, match="backups"), install_for(detect(comfy, gpu=False), patches, run=True) as install:
        operations.apply(install, patches)
    assert len(backups) == 2
    assert tree_bytes(comfy) == before
    state = comfy / ".applier"
    assert not [p for p in (state / "backups").rglob("*") if p.is_file()]
    assert not (state / "journal.json").exists() and not (state / "journal-data").exists()
    assert not (state / "state.json").exists()


def test_disk_full_mid_run_rolls_back_and_says_so(tmp_path, monkeypatch):
    import errno

    from applier import operations
    from applier.catalog import load_catalog
    from applier.catalog.allowlist import install_for
    from applier.detect import detect
    from applier.errors import IOFailure
    from applier.store.heldroot import HeldRoot

    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    before = tree_bytes(comfy)
    real_replace = HeldRoot.replace
    calls = []

    def replace_then_fill_the_disk(self, rel, data):
        calls.append(rel)
        if len(calls) == 2 and data is not None:       # the second file of the run: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(self, rel, data)

    monkeypatch.setattr(HeldRoot, "replace", replace_then_fill_the_disk)
    patches = load_catalog(catalog)
    with pytest.raises(IOFailure, match="no space left"), install_for(detect(comfy, gpu=False), patches, run=True) as install:
        operations.apply(install, patches)
    assert tree_bytes(comfy) == before                   # the first file was rolled back
    assert not (comfy / ".applier" / "journal.json").exists()
    assert not (comfy / ".applier" / "state.json").exists()


def test_recovery_checks_every_file_before_it_writes_any(tmp_path):
    """An interrupted run whose last file someone edited meanwhile (neither its old nor its new bytes) is refused
    (exit 7) before recovery writes anything: the files before it keep the bytes they had, the journal stays."""
    import json
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog),
                   env={"APPLIER_FAILPOINT": "after-journal"})
    assert proc.returncode == failpoints.EXIT_CODE, proc.stdout + proc.stderr
    entries = json.loads((comfy / ".applier" / "journal.json").read_text())["files"]
    assert len(entries) >= 2
    edited = comfy / entries[-1]["relpath"]
    edited.write_bytes(edited.read_bytes() + b"# a hand edit made while the run was interrupted\n")
    proc = run_cli("status", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == 7 and "neither its old nor its new bytes" in proc.stderr, proc.stderr
    now = tree_bytes(comfy)
    for entry in entries[:-1]:
        assert now[entry["relpath"]] == before[entry["relpath"]], entry["relpath"]
    assert (comfy / ".applier" / "journal.json").exists()


def test_a_pending_run_is_finished_whatever_the_old_state_file_holds(tmp_path):
    """While a committed run's journal is there, the state it records is the journal's state_after: the command that
    finishes it never parses the state file the run is about to replace (a damaged one included)."""
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog),
                   env={"APPLIER_FAILPOINT": "after-journal"})
    assert proc.returncode == failpoints.EXIT_CODE, proc.stdout + proc.stderr
    (comfy / ".applier" / "state.json").write_text("{ not json")
    code, status = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, status
    assert {p["state"] for p in status["patches"]} == {"applied"}
    assert not (comfy / ".applier" / "journal.json").exists()


def test_recovery_needs_no_blob_of_a_file_already_written(tmp_path):
    """A file the interrupted run had written already keeps its bytes; its journal-data/ copy is not needed (only the
    files still at their old bytes read theirs)."""
    import json
    comfy, catalog = make_comfy(tmp_path), make_catalog(tmp_path)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog),
                   env={"APPLIER_FAILPOINT": "after-first-file"})
    assert proc.returncode == failpoints.EXIT_CODE, proc.stdout + proc.stderr
    first = json.loads((comfy / ".applier" / "journal.json").read_text())["files"][0]
    (comfy / ".applier" / "journal-data" / first["new_bytes"]).unlink()
    code, status = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, status
    assert {p["state"] for p in status["patches"]} == {"applied"}
