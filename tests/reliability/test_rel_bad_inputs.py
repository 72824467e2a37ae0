"""Section 5, bad input: every class of bad install, state, catalog or output stream ends with a documented exit code
(applier/errors.py: 3 refused, 4 locked, 5 drift, 7 corrupt state, 8 I/O, 9 bad target) and a one-line reason,
never a traceback or an "internal error"; and the wrong-result cases (a deleted execution.py, a symlinked nodes.py,
two sections for one file) behave as documented."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from reltools import (PATCHED, REPO, assert_clean, child_env, cli, fork_cli, make_install, run, snapshot,
                      state_files, strays, wait_exit)
from shelltools import MAXRES_DIFF, NODES_PY, write_patch

pytestmark = pytest.mark.slow


def unchanged(inst, before) -> None:
    assert snapshot(inst.root) == before[0], "the tree changed"
    assert state_files(inst) == before[1], ".applier/ changed"
    assert not strays(inst.root), strays(inst.root)


def saved(inst):
    return snapshot(inst.root), state_files(inst)


# ------------------------------------------------------------------------------------------ the install itself

@contextmanager
def read_only(folder: Path):
    """No new entry can be made in folder, even by root (who ignores modes: chattr +i binds root too)."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root, where modes do not bind, and chattr is not available")
    proc = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"running as root, where modes do not bind, and chattr +i failed: {proc.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_target_folder_is_an_io_error(plain):
    before = saved(plain)
    with read_only(plain.root):
        assert_clean(cli(*plain.args("status")), allowed=(0,))
        out = assert_clean(cli(*plain.args("apply")), allowed=(8,))
    assert "hint" in out.stderr
    unchanged(plain, before)


def test_a_revert_into_a_read_only_folder_changes_nothing(applied):
    before = saved(applied)
    with read_only(applied.comfy):
        assert_clean(cli(*applied.args("revert")), allowed=(8,))
    unchanged(applied, before)
    assert_clean(cli(*applied.args("revert")), allowed=(0,))
    assert snapshot(applied.root)[0] == applied.base_files


def test_a_read_only_state_folder_is_an_io_error(applied):
    before = saved(applied)
    with read_only(applied.root / ".applier"):
        assert_clean(cli(*applied.args("revert")), allowed=(8,))
        assert_clean(cli(*applied.args("status")), allowed=(0,))
    unchanged(applied, before)


def test_applier_as_a_file(plain):
    (plain.root / ".applier").write_text("not a folder\n")
    before = saved(plain)
    for command in (("status",), ("list",), ("apply",), ("revert",), ("overlay", "list"), ("overlay", "uninstall")):
        assert_clean(cli(*plain.args(*command)), allowed=(7, 8))
    assert snapshot(plain.root) == before[0]


def test_the_lock_as_a_folder(applied):
    (applied.root / ".applier" / "lock").unlink(missing_ok=True)
    (applied.root / ".applier" / "lock").mkdir()
    before = saved(applied)
    for command in (("apply",), ("revert",)):
        assert_clean(cli(*applied.args(*command)), allowed=(4, 7, 8))
    for command in (("status",), ("list",)):
        assert_clean(cli(*applied.args(*command)))
    unchanged(applied, before)


def test_a_missing_target_and_a_file_as_target(tmp_path):
    assert_clean(cli("status", "--target", tmp_path / "nope"), allowed=(9,))
    (tmp_path / "file").write_text("x")
    assert_clean(cli("apply", "--target", tmp_path / "file"), allowed=(9,))


# ------------------------------------------------------------------------------------------ state with wrong types

def mutate_state(inst, change) -> None:
    path = inst.root / ".applier" / "state.json"
    state = json.loads(path.read_text())
    change(state, state["applied"]["comfyui/maxres"], state["applied"]["comfyui/maxres"]["files"][0])
    path.write_text(json.dumps(state, indent=2))


STATE_TYPES = {
    "seq-a-string": lambda s, rec, f: rec.update(seq="1"),
    "relpath-a-number": lambda s, rec, f: f.update(relpath=5),
    "files-a-string": lambda s, rec, f: rec.update(files="nodes.py"),
    "applied-a-list": lambda s, rec, f: s.update(applied=[rec]),
    "sha256-a-number": lambda s, rec, f: f.update(sha256_after=12),
    "mode-a-string": lambda s, rec, f: f.update(mode="0644"),
    "fuzz-a-list": lambda s, rec, f: rec.update(fuzz=[1]),
    "file-entry-null": lambda s, rec, f: rec.update(files=[None]),
    "format-a-string": lambda s, rec, f: s.update(format="2"),
}


@pytest.mark.parametrize("case", list(STATE_TYPES))
def test_a_state_with_wrong_types_is_refused(applied, case):
    mutate_state(applied, STATE_TYPES[case])
    before = saved(applied)
    for command in ("status", "revert", "apply", "list"):
        assert_clean(cli(*applied.args(command)), allowed=(7,))
    unchanged(applied, before)


def test_a_format_1_state_with_a_numeric_path(applied):
    """Format 1's absolute "path" is ignored (relpath decides): a number there is harmless or refused."""
    mutate_state(applied, lambda s, rec, f: (s.update(format=1), f.update(path=5)))
    for command in ("status", "revert"):
        assert_clean(cli(*applied.args(command)), allowed=(0, 7))


# ------------------------------------------------------------------------------------------ journals

@pytest.fixture
def interrupted(plain):
    """An apply killed after its journal was committed."""
    code = wait_exit(fork_cli(*plain.args("apply"), env={"APPLIER_FAILPOINT": "after-journal"}))
    assert code == 77
    assert plain.journal.exists()
    return plain


def mutate_journal(inst, change) -> None:
    journal = json.loads(inst.journal.read_text())
    change(journal, journal["files"][0])
    inst.journal.write_text(json.dumps(journal, indent=2))


JOURNAL_CASES = {
    "entry-without-new-sha256": lambda j, e: e.pop("new_sha256"),
    "entry-without-relpath": lambda j, e: (e.pop("relpath", None), e.pop("path", None)),
    "entry-without-new-bytes": lambda j, e: e.pop("new_bytes"),
    "files-missing": lambda j, e: j.pop("files"),
    "state-after-missing": lambda j, e: j.pop("state_after"),
    "entry-a-string": lambda j, e: j.update(files=["nodes.py"]),
    "names-a-folder": lambda j, e: e.update(relpath="custom_nodes"),
    "relpath-a-number": lambda j, e: e.update(relpath=3),
    "format-unknown": lambda j, e: j.update(format=99),
}


@pytest.mark.parametrize("case", list(JOURNAL_CASES))
def test_a_broken_journal_is_refused(interrupted, case):
    mutate_journal(interrupted, JOURNAL_CASES[case])
    before = saved(interrupted)
    for command in ("status", "list", "revert", "apply"):
        assert_clean(cli(*interrupted.args(command)), allowed=(7, 8))
    assert snapshot(interrupted.root) == before[0]


def test_a_journal_naming_a_file_that_became_a_folder(interrupted):
    (interrupted.comfy / "nodes.py").unlink()
    (interrupted.comfy / "nodes.py").mkdir()
    for command in ("status", "revert", "apply"):
        assert_clean(cli(*interrupted.args(command)), allowed=(7, 8, 9))
    assert (interrupted.comfy / "nodes.py").is_dir()


# ------------------------------------------------------------------------------------------ overlay manifest

def first_entry(m: dict, **values) -> dict:
    m["files"][0].update(values)
    return m


OVERLAY_CASES = {        # the installed manifest -> what a crafted one holds instead
    "files-a-string": lambda m: {**m, "files": "fused_dit/__init__.py"},
    "entry-a-string": lambda m: {**m, "files": ["fused_dit/__init__.py"]},
    "relpath-a-number": lambda m: first_entry(m, relpath=5, path=5),
    "sha-a-list": lambda m: first_entry(m, sha256=["x"]),
    "manifest-a-list": lambda m: [m],
    "files-null": lambda m: {**m, "files": None},
    # JSON holds a lone surrogate, which no file name can have: refused before any file call sees it
    "relpath-a-lone-surrogate": lambda m: first_entry(m, relpath="fused_dit/\ud800.py"),
}


@pytest.mark.parametrize("case", list(OVERLAY_CASES))
def test_a_broken_overlay_manifest_is_refused(tmp_path, case):
    inst = make_install(tmp_path / "t")
    assert_clean(cli(*inst.args("overlay", "install")), allowed=(0,))
    path = inst.root / ".applier" / "overlays.json"
    path.write_text(json.dumps(OVERLAY_CASES[case](json.loads(path.read_text()))))
    tree = snapshot(inst.root)
    for command in (("overlay", "list"), ("overlay", "uninstall"), ("overlay", "install")):
        assert_clean(cli(*inst.args(*command)), allowed=(7,))
    assert_clean(cli(*inst.args("status")))
    assert snapshot(inst.root) == tree


# ------------------------------------------------------------------------------------------ disk full

def limited(max_bytes: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # writing past the limit is then EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return preexec


def big_install(tmp_path):
    inst = make_install(tmp_path / "t", layout="plain")
    filler = "".join(f"# filler line {i:05d} written by the reliability suite\n" for i in range(2000))
    (inst.comfy / "nodes.py").write_text(NODES_PY + filler)    # ~100 kB: more than the limit below
    inst.base_files, inst.base_dirs = snapshot(inst.root)
    return inst


def test_disk_full_while_backups_are_written(tmp_path):
    inst = big_install(tmp_path)
    before = saved(inst)
    out = run(*inst.args("apply"), env={"PYTHONDONTWRITEBYTECODE": "1"}, preexec_fn=limited(32 * 1024))
    assert_clean(out, allowed=(8,))
    unchanged(inst, before)
    assert not inst.journal.exists()
    assert_clean(cli(*inst.args("apply")), allowed=(0,))        # with room again, it works


def test_disk_full_while_a_revert_writes_its_journal(tmp_path):
    inst = big_install(tmp_path)
    assert_clean(cli(*inst.args("apply")), allowed=(0,))
    before = saved(inst)
    out = run(*inst.args("revert"), env={"PYTHONDONTWRITEBYTECODE": "1"}, preexec_fn=limited(32 * 1024))
    assert_clean(out, allowed=(8,))
    unchanged(inst, before)
    assert_clean(cli(*inst.args("status")), allowed=(0,))


# ------------------------------------------------------------------------------------------ malformed patch.toml

GOOD_TOML = '''title = "Raise MAX_RESOLUTION"
summary = "test"

[[variant]]
name = "16384-era"
versions = ">=0.0.1"
diff = "16384-era.diff"
'''
TOML_CASES = {
    "non-utf8-byte": GOOD_TOML.encode().replace(b"Raise", b"Ra\xffse"),
    "variant-as-a-table": GOOD_TOML.replace("[[variant]]", "[variant]").encode(),
    "diff-a-number": GOOD_TOML.replace('diff = "16384-era.diff"', "diff = 5").encode(),
    "versions-a-list": GOOD_TOML.replace('versions = ">=0.0.1"', 'versions = [">=0.0.1"]').encode(),
    "name-a-list": GOOD_TOML.replace('name = "16384-era"', 'name = ["16384-era"]').encode(),
    "title-a-number": GOOD_TOML.replace('title = "Raise MAX_RESOLUTION"', "title = 5").encode(),
    "default-a-string": GOOD_TOML.replace('summary = "test"', 'summary = "test"\ndefault = "no"').encode(),
    "tested-a-number": GOOD_TOML.replace('diff = "16384-era.diff"', 'diff = "16384-era.diff"\ntested = 7').encode(),
    "variant-a-string": b'title = "x"\nvariant = "16384-era"\n',
    "not-toml": b"[[variant\nname = \n",
    "diff-a-folder": GOOD_TOML.replace('diff = "16384-era.diff"', 'diff = "."').encode(),
}


@pytest.mark.parametrize("case", list(TOML_CASES))
def test_a_malformed_patch_toml_is_refused(plain, tmp_path, case):
    catalog = tmp_path / "patches-copy"
    shutil.copytree(REPO / "patches", catalog)
    (catalog / "comfyui" / "max-resolution" / "patch.toml").write_bytes(TOML_CASES[case])
    before = saved(plain)
    for command in ("list", "status", "apply"):
        out = assert_clean(cli(command, "--target", plain.root, "--patches", catalog), allowed=(3,))
        assert "max-resolution" in out.stderr, out
    unchanged(plain, before)


# ------------------------------------------------------------------------------------------ output into a closed pipe

def test_output_piped_into_head(applied, tmp_path):
    err = tmp_path / "stderr"
    for command in ("list --json", "status", "explain torch/stream-priority"):
        target = "" if command.startswith("explain") else f"--target '{applied.root}'"
        script = (f"'{sys.executable}' -m applier {command} {target} 2>'{err}' | head -c1 >/dev/null; "
                  "echo ${PIPESTATUS[0]}")
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=child_env(), cwd=REPO)
        code = int(proc.stdout.strip())
        text = err.read_text()
        assert code in (0, 8, 128 + signal.SIGPIPE), f"{command}: exit {code}\n{text}"
        assert "Traceback" not in text and "BrokenPipe" not in text and "Exception ignored" not in text, text


@pytest.mark.parametrize("command", [("list", "--json"), ("status",), ("detect", "--json")])
def test_output_into_a_pipe_closed_before_the_first_byte(applied, command):
    proc = subprocess.Popen([sys.executable, "-m", "applier", *command, "--target", str(applied.root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=REPO)
    proc.stdout.close()                     # nobody reads: the first write gets EPIPE
    err = proc.stderr.read().decode()
    code = proc.wait()
    assert code in (0, 8, -signal.SIGPIPE), f"exit {code}\n{err}"
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


# ------------------------------------------------------------------------------------------ wrong results

def test_a_deleted_execution_py_blocks_neither_status_nor_revert(plain):
    assert_clean(cli(*plain.args("apply", "--only", "comfyui/maxres")), allowed=(0,))
    (plain.comfy / "execution.py").unlink()
    assert_clean(cli(*plain.args("status")), allowed=(0, 5))
    assert_clean(cli(*plain.args("revert")), allowed=(0,))
    assert (plain.comfy / "nodes.py").read_text() == NODES_PY


def test_a_deleted_patched_file_blocks_no_revert_of_the_others(applied):
    (applied.comfy / "execution.py").unlink()
    assert_clean(cli(*applied.args("status")), allowed=(0, 5))
    assert_clean(cli(*applied.args("revert")), allowed=(0, 5))
    assert (applied.comfy / "nodes.py").read_text() == NODES_PY


def test_a_symlinked_nodes_py_stays_a_symlink(plain):
    real = plain.comfy / "real" / "nodes_impl.py"
    real.parent.mkdir()
    (plain.comfy / "nodes.py").rename(real)
    (plain.comfy / "nodes.py").symlink_to(Path("real") / "nodes_impl.py")
    link = os.readlink(plain.comfy / "nodes.py")
    out = assert_clean(cli(*plain.args("apply", "--only", "comfyui/maxres")), allowed=(0, 3))
    assert os.readlink(plain.comfy / "nodes.py") == link, "apply replaced the link"
    if out.code == 3:                       # refusing the link is allowed; then nothing changed
        assert real.read_text() == NODES_PY
        return
    assert real.read_bytes() == PATCHED["nodes.py"], "apply did not patch the link's target"
    status = assert_clean(cli(*plain.args("status", "--json")), allowed=(0,)).json()
    assert {p["id"]: p["state"] for p in status["patches"]}["comfyui/maxres"] == "applied"
    assert_clean(cli(*plain.args("revert")), allowed=(0,))
    assert os.readlink(plain.comfy / "nodes.py") == link, "revert replaced the link"
    assert real.read_text() == NODES_PY


def test_a_diff_with_two_sections_for_one_file_is_refused(plain, tmp_path):
    catalog = tmp_path / "twice"
    second = ("--- a/nodes.py\n+++ b/nodes.py\n@@ -4,3 +4,3 @@\n \n-class EmptyLatentImage:\n"
              "+class EmptyLatentImage:  # twice\n     @classmethod\n")
    write_patch(catalog, "comfyui/twice", [("all", ">=0", MAXRES_DIFF + second)])
    before = saved(plain)
    out = assert_clean(cli("apply", "--target", plain.root, "--patches", catalog), allowed=(3,))
    assert "nodes.py" in out.stderr
    unchanged(plain, before)
    assert_clean(cli("status", "--target", plain.root, "--patches", catalog))
