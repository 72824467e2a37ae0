"""Round 3 (issue 32), the inputs: bounded catalog diffs, environment variables, Python's interactive variables,
bounded verify scans, `.` in catalog paths, and catalog entries that cannot be read. Every case ends with a
documented exit code and no traceback; bounds are tested with a tiny configured limit, never with a timing."""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from reltools import assert_clean, cli, run, snapshot, state_files
from shelltools import MAXRES_DIFF, NODES_PY, write_patch

pytestmark = pytest.mark.slow


def unchanged_by(inst, before) -> None:
    assert (snapshot(inst.root), state_files(inst)) == before, "the tree or .applier/ changed"


def one_patch_catalog(tmp_path: Path, diff: str | bytes, name: str = "comfyui/big") -> Path:
    catalog = tmp_path / "cat"
    folder = write_patch(catalog, name, [("all", ">=0", "")])
    (folder / "all.diff").write_bytes(diff if isinstance(diff, bytes) else diff.encode())
    return catalog


# ------------------------------------------------------------------------- 8: bounded catalog diffs (exit 3)

def unmatched_hunks(count: int) -> str:
    return "--- a/nodes.py\n+++ b/nodes.py\n" + "".join(f"@@ -{i + 1},1 +{i + 1},1 @@\n-absent {i}\n+new {i}\n"
                                                        for i in range(count))


def test_a_diff_with_more_hunks_than_the_limit_is_refused_before_any_search(plain, tmp_path):
    from applier.diffengine.parse import MAX_HUNKS
    catalog = one_patch_catalog(tmp_path, unmatched_hunks(MAX_HUNKS + 1))
    before = (snapshot(plain.root), state_files(plain))
    out = assert_clean(cli("apply", "--target", plain.root, "--patches", catalog), allowed=(3,))
    assert f"over applier's limit of {MAX_HUNKS}" in out.stderr, out
    status = assert_clean(cli("status", "--target", plain.root, "--patches", catalog, "--json")).json()
    assert f"limit of {MAX_HUNKS}" in status["patches"][0]["reason"], status
    unchanged_by(plain, before)


def test_a_diff_larger_than_the_limit_is_a_catalog_error_naming_it(plain, tmp_path):
    from applier.diffengine.parse import MAX_PATCH_BYTES
    diff = MAXRES_DIFF + "".join(f"# padding line {i}\n" for i in range(MAX_PATCH_BYTES // 16))
    catalog = one_patch_catalog(tmp_path, diff)
    for command in ("list", "status", "apply"):
        out = assert_clean(cli(command, "--target", plain.root, "--patches", catalog), allowed=(3,))
        assert "all.diff" in out.stderr and f"limit of {MAX_PATCH_BYTES}" in out.stderr, out


def test_locating_hunks_is_bounded_by_positions_tried(plain, tmp_path, monkeypatch):
    """Hunks made of lines the file holds everywhere are tried at each place; past the budget: exit 3."""
    from applier.diffengine import locate
    monkeypatch.setattr(locate, "MAX_POSITIONS_TRIED", 20)
    (plain.comfy / "nodes.py").write_text(NODES_PY + "x\n\n" * 40)
    diff = "--- a/nodes.py\n+++ b/nodes.py\n" + "".join(f"@@ -{i * 3 + 1},2 +{i * 3 + 1},2 @@\n-x\n-x\n+y\n+y\n"
                                                        for i in range(5))
    out = assert_clean(cli("apply", "--target", plain.root, "--patches", one_patch_catalog(tmp_path, diff)),
                       allowed=(3,))
    assert "nodes.py" in out.stderr and "more than 20 positions" in out.stderr, out


def test_a_hunk_found_nowhere_costs_a_lookup_not_a_pass_over_the_file(monkeypatch):
    """1,000 hunks whose lines the file does not hold try no position at all, whatever the file's size."""
    from applier import diffengine
    from applier.diffengine import locate
    monkeypatch.setattr(locate, "MAX_POSITIONS_TRIED", 1)
    original = "".join(f"line {i}\n" for i in range(5000)).encode()
    [file_patch] = diffengine.parse_patch(unmatched_hunks(1000).replace("nodes.py", "x.py").encode())
    reports = diffengine.scan_file(file_patch, original)
    assert {r.state for r in reports} == {diffengine.HunkState.CONFLICT} and len(reports) == 1000


# ------------------------------------------------------------------------- 12: `.` in catalog paths

@pytest.mark.parametrize("spelled", ["a/./nodes.py", "./a/nodes.py", "a//nodes.py"])
def test_a_catalog_path_with_dot_components_is_normalised(plain, tmp_path, spelled):
    (plain.comfy / "a").mkdir()
    (plain.comfy / "a" / "nodes.py").write_text("x\n")
    catalog = one_patch_catalog(tmp_path, f"--- a/{spelled}\n+++ b/{spelled}\n@@ -1 +1 @@\n-x\n+y\n")
    out = assert_clean(cli("apply", "--target", plain.root, "--patches", catalog), allowed=(0,))
    assert (plain.comfy / "a" / "nodes.py").read_text() == "y\n", out
    state = json.loads((plain.root / ".applier" / "state.json").read_text())
    assert "a/./" not in json.dumps(state) and "a//" not in json.dumps(state), state
    status = assert_clean(cli("status", "--target", plain.root, "--patches", catalog, "--json")).json()
    assert status["patches"][0]["state"] == "applied", status
    assert_clean(cli("revert", "--target", plain.root, "--patches", catalog), allowed=(0,))
    assert (plain.comfy / "a" / "nodes.py").read_text() == "x\n"


def test_a_catalog_path_naming_a_folder_is_refused(plain, tmp_path):
    catalog = one_patch_catalog(tmp_path, "--- a/a/./\n+++ b/a/./\n@@ -1 +1 @@\n-x\n+y\n")
    out = assert_clean(cli("apply", "--target", plain.root, "--patches", catalog), allowed=(3,))
    assert "names a folder" in out.stderr, out


# ------------------------------------------------------------------------- catalog entries that cannot be read

def make_fifo(path: Path) -> None:
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    os.mkfifo(path)


def make_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


UNREADABLE = {
    "patch.toml a FIFO": (lambda c: make_fifo(c / "comfyui/maxres/patch.toml"), "FIFO"),
    "patch.toml a folder": (lambda c: make_folder(c / "comfyui/maxres/patch.toml"), "folder"),
    "diff a FIFO": (lambda c: make_fifo(c / "comfyui/maxres/all.diff"), "FIFO"),
    "diff a folder": (lambda c: make_folder(c / "comfyui/maxres/all.diff"), "folder"),
    "component a file": (lambda c: (c / "torch").write_text("not a folder\n"), "is a file"),
    "patch folder a link to nothing": (lambda c: (c / "comfyui/gone").symlink_to(c / "nowhere"), "link to nothing"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_a_catalog_entry_that_cannot_be_read_is_an_error_naming_it(plain, case):
    spoil, said = UNREADABLE[case]
    spoil(plain.catalog)
    before = (snapshot(plain.root), state_files(plain))
    for command in ("list", "status", "apply"):
        out = assert_clean(run(*plain.args(command), timeout=60), allowed=(3,))   # a FIFO is never waited on
        assert said in out.stderr and str(plain.catalog) in out.stderr, out
    unchanged_by(plain, before)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder whatever its mode")
def test_a_patch_folder_that_cannot_be_read_is_an_error_naming_it(plain):
    folder = plain.catalog / "comfyui" / "maxres"
    folder.chmod(0)
    try:
        for command in ("list", "status", "apply"):
            out = assert_clean(cli(*plain.args(command)), allowed=(3,))
            assert str(folder) in out.stderr, out
    finally:
        folder.chmod(0o755)


@contextmanager
def no_hang(seconds: int):
    def fail(signum, frame):
        raise AssertionError(f"blocked for {seconds} s")
    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_diff_swapped_for_a_fifo_after_loading_is_refused_unopened(plain):
    from applier.catalog import CatalogError, load_catalog
    [patch] = [p for p in load_catalog(plain.catalog) if p.id == "comfyui/maxres"]
    make_fifo(patch.variants[0].diff_path)
    with no_hang(20), pytest.raises(CatalogError) as raised:
        patch.variants[0].read_diff()
    assert "FIFO" in raised.value.message and "all.diff" in raised.value.message


# ------------------------------------------------------------------------- 9: environment variables (exit 2)

BAD_SETTINGS = [("APPLIER_LOCK_TIMEOUT", value) for value in ("abc", "nan", "inf", "-1", "1e9")] + \
               [("APPLIER_DETECT_TIMEOUT", value) for value in ("abc", "nan", "inf", "0", "-2")] + \
               [("APPLIER_NO_GPU_PROBE", "yes"), ("APPLIER_FAILPOINT", "after-everything")]


@pytest.mark.parametrize("variable,value", BAD_SETTINGS)
def test_a_bad_environment_value_is_a_usage_error_naming_the_variable(applied, variable, value):
    before = (snapshot(applied.root), state_files(applied))
    for command in ("status", "detect", "revert"):
        args = applied.args(command) if command != "detect" else ("detect", "--target", applied.root)
        out = assert_clean(cli(*args, env={variable: value}), allowed=(2,))
        assert variable in out.stderr and repr(value) in out.stderr, out
    unchanged_by(applied, before)


def test_a_bad_lock_timeout_is_exit_2_as_a_user_runs_it(plain):
    out = assert_clean(run(*plain.args("status"), env={"APPLIER_LOCK_TIMEOUT": "abc"}), allowed=(2,))
    assert "APPLIER_LOCK_TIMEOUT='abc'" in out.stderr, out


@pytest.mark.parametrize("variable,value", [("APPLIER_LOCK_TIMEOUT", "0"), ("APPLIER_LOCK_TIMEOUT", "300"),
                                            ("APPLIER_LOCK_TIMEOUT", ""), ("APPLIER_DETECT_TIMEOUT", "0.5"),
                                            ("APPLIER_DETECT_TIMEOUT", "1000"), ("APPLIER_NO_GPU_PROBE", "0"),
                                            ("APPLIER_FAILPOINT", "")])
def test_good_environment_values_still_work(plain, variable, value):
    assert_clean(cli(*plain.args("status"), env={variable: value}), allowed=(0,))


def test_the_settings_readers_turn_values_into_numbers(monkeypatch):
    from applier import settings
    monkeypatch.setenv("APPLIER_LOCK_TIMEOUT", "2.5")
    monkeypatch.setenv("APPLIER_DETECT_TIMEOUT", "100")
    assert settings.lock_timeout(5.0) == 2.5 and settings.detect_timeout(20) == 20
    monkeypatch.setenv("APPLIER_DETECT_TIMEOUT", "0.5")
    assert settings.detect_timeout(20) == 0.5
    monkeypatch.delenv("APPLIER_LOCK_TIMEOUT")
    assert settings.lock_timeout(30.0) == 30.0
    monkeypatch.setenv("APPLIER_LOCK_TIMEOUT", "nan")
    with pytest.raises(settings.BadSetting) as raised:
        settings.lock_timeout(5.0)
    assert raised.value.exit_code == 2


# ------------------------------------------------------------------------- 10: Python's interactive variables

INTERACTIVE = {"PYTHONINSPECT": "1", "PYTHONSTARTUP": "/nonexistent/startup.py"}


@pytest.mark.parametrize("args,code", [(("--version",), 0), (("status",), 0), (("status", "--json"), 0),
                                       (("apply", "--dry-run"), 0), (("detect", "--target", "/nonexistent"), 9)])
def test_pythoninspect_leaves_every_command_its_exit_status(plain, args, code):
    full = (*plain.args(*args),) if args[0] in ("status", "apply") else args
    out = assert_clean(run(*full, env=INTERACTIVE, stdin=subprocess.DEVNULL), allowed=(code,))
    assert "SystemExit" not in out.text, out
    if "--json" in args:
        json.loads(out.stdout)


def test_pythoninspect_leaves_the_console_script_its_exit_status(plain):
    script = Path(sys.executable).parent / "applier"
    if not script.is_file():
        pytest.skip("no `applier` console script beside this interpreter")
    from reltools import child_env
    proc = subprocess.run([str(script), *map(str, plain.args("status"))], capture_output=True, text=True,
                          env=child_env(INTERACTIVE), stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_probes_ignore_pythoninspect(tmp_path, monkeypatch):
    """The children applier starts run isolated (-I): PYTHON* variables of the user's shell do not reach them."""
    from verify.runner import run_probe
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "says.py").write_text("import json, sys\nprint(json.dumps({'outcome': 'PASS', 'reason': 'ok', "
                                    "'numbers': {'inspect': sys.flags.inspect}}))\n")
    for name, value in INTERACTIVE.items():
        monkeypatch.setenv(name, value)
    result = run_probe(sys.executable, "says", {}, 60, probes_dir=probes)
    assert result.returncode == 0 and result.numbers == {"inspect": 0}, result


# ------------------------------------------------------------------------- 11: bounded verify scans (WARN)

def resolution_caps(inst) -> dict:
    out = assert_clean(cli(*inst.args("verify", "--only", "resolution-caps", "--json")), allowed=(0,))
    [check] = [c for c in out.json()["checks"] if c["name"] == "resolution-caps"]
    return check


def scan_module():
    from applier.resources import load_verify
    load_verify()
    return importlib.import_module("applier_verify.checks.resolution")


@contextmanager
def nested_folders(top: Path, depth: int):
    """top/d/d/.../d, `depth` deep, made and removed in loops (os.makedirs and shutil.rmtree recurse)."""
    paths = [str(top / "d")]
    for _ in range(depth - 1):
        paths.append(paths[-1] + "/d")
    for path in paths:
        os.mkdir(path)
    try:
        yield
    finally:
        for path in reversed(paths):
            os.rmdir(path)


def test_a_deep_custom_nodes_tree_is_a_warn_naming_the_depth_limit(plain):
    deep = plain.comfy / "custom_nodes" / "pack"
    deep.mkdir()
    (deep / "caps.py").write_text('IN = {"width": ("INT", {"max": 2048})}\n')
    with nested_folders(deep, 1200):      # deeper than Python's recursion limit
        check = resolution_caps(plain)
    assert check["outcome"] == "WARN", check
    assert any("MAX_SCAN_DEPTH" in limit for limit in check["numbers"]["limits"]), check
    assert "custom_nodes/pack/caps.py:1:2048" in check["numbers"]["caps"], check      # what is shallow still counts


def test_a_custom_nodes_tree_past_the_count_limits_is_a_warn_naming_them(plain, monkeypatch):
    resolution = scan_module()
    for number in range(30):
        (plain.comfy / "custom_nodes" / f"node_{number:02}.py").write_text("VALUE = 1\n")
    monkeypatch.setattr(resolution, "MAX_SCANNED_FILES", 10)
    check = resolution_caps(plain)
    assert check["outcome"] == "WARN" and check["numbers"]["files_scanned"] == 10, check
    assert any("MAX_SCANNED_FILES" in limit for limit in check["numbers"]["limits"]), check
    monkeypatch.setattr(resolution, "MAX_SCAN_ENTRIES", 5)
    check = resolution_caps(plain)
    assert check["outcome"] == "WARN" and check["numbers"]["files_scanned"] <= 5, check
    assert any("MAX_SCAN_ENTRIES" in limit for limit in check["numbers"]["limits"]), check


def test_a_scan_within_the_limits_still_passes(plain):
    (plain.comfy / "custom_nodes" / "pack" / "sub").mkdir(parents=True)
    (plain.comfy / "custom_nodes" / "pack" / "sub" / "node.py").write_text("VALUE = 1\n")
    check = resolution_caps(plain)
    assert check["outcome"] == "PASS" and check["numbers"]["limits"] == [], check


def test_a_deeply_nested_constant_expression_is_not_a_crash(plain):
    (plain.comfy / "custom_nodes" / "deep_expr.py").write_text("MAX_RESOLUTION = " + " + ".join(["1"] * 1000) + "\n")
    check = resolution_caps(plain)
    assert check["outcome"] in ("PASS", "WARN") and "RecursionError" not in json.dumps(check), check
