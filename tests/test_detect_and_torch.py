"""Detection across layouts, and the whole cycle on a venv holding real torch files checked against RECORD."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from applier.detect import detect
from applier.store.record import pristine_hashes
from applier.target import GPU
from shelltools import cli_json, make_catalog, make_comfy, make_torch_env, run_cli, write_patch


def test_git_checkout_with_version_file(tmp_path):
    comfy = make_comfy(tmp_path, version="0.3.64", git=True)
    found = detect(comfy, gpu=False)
    assert found.layout == "git-checkout"
    assert (found.comfyui_version, found.comfyui_version_source) == ("0.3.64", "comfyui_version.py")
    assert found.comfyui_commit and found.python is None
    assert any("no Python environment" in n for n in found.notes)


def test_version_from_pyproject_then_git_tag_then_unknown(tmp_path):
    comfy = make_comfy(tmp_path / "a", version=None)
    (comfy / "pyproject.toml").write_text('[project]\nname = "ComfyUI"\nversion = "0.3.12"\n')
    assert detect(comfy, gpu=False).comfyui_version == "0.3.12"
    tagged = make_comfy(tmp_path / "b", version=None, git=True)
    subprocess.run(["git", "-C", str(tagged), "tag", "v0.2.7"], check=True)
    found = detect(tagged, gpu=False)
    assert (found.comfyui_version, found.comfyui_version_source) == ("0.2.7", "git tag")
    plain = make_comfy(tmp_path / "c", version=None)
    found = detect(plain, gpu=False)
    assert (found.comfyui_version, found.comfyui_version_source, found.layout) == (None, "unknown", "plain")


def test_portable_layout(tmp_path):
    outer = tmp_path / "ComfyUI_windows_portable"
    make_comfy(outer, version="0.3.40")
    site = outer / "python_embeded" / "Lib" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.7.1+cu128'\ncuda = '12.8'\n")
    (outer / "python_embeded" / "python.exe").write_bytes(b"MZ not runnable here")
    found = detect(outer, gpu=False)
    assert found.layout == "portable" and found.comfyui_root == outer / "ComfyUI"
    assert found.python_source == "python_embeded"
    assert found.site_packages == site
    assert (found.torch_version, found.torch_cuda) == ("2.7.1+cu128", "12.8")


def test_bad_targets_exit_9(tmp_path):
    proc = run_cli("detect", "--target", str(tmp_path / "missing"))
    assert proc.returncode == 9 and "does not exist" in proc.stderr
    proc = run_cli("detect", "--target", str(tmp_path))
    assert proc.returncode == 9 and "neither ComfyUI" in proc.stderr


@pytest.fixture(scope="module")
def torch_env(tmp_path_factory):
    return make_torch_env(tmp_path_factory.mktemp("torchenv"))


def test_detect_reads_torch_without_importing_it(torch_env):
    env, site = torch_env
    code, out = cli_json("detect", "--target", str(env))
    assert code == 0, out
    assert out["layout"] == "python-env" and out["site_packages"] == str(site)
    # the copy holds no torch/__init__.py: importing torch there would fail, so detection cannot have imported it
    assert not (site / "torch" / "__init__.py").exists()
    assert out["torch_version"].startswith("2.") and "+" in out["torch_version"]


def test_bare_comfyui_takes_comfyui_patches_and_torch_is_not_applicable(tmp_path):
    comfy = make_comfy(tmp_path)
    catalog = make_catalog(tmp_path)
    write_patch(catalog, "torch/t", [("all", ">=2.0", "--- a/torch/cuda/streams.py\n+++ b/torch/cuda/streams.py\n")])
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    plans = {p["id"]: p for p in out["patches"]}
    assert plans["comfyui/maxres"]["action"] == "apply"
    assert plans["torch/t"]["action"] == "not-applicable" and "no Python environment" in plans["torch/t"]["reason"]


STREAM_DIFF_TEMPLATE = """\
--- a/torch/cuda/streams.py
+++ b/torch/cuda/streams.py
@@ -{line},1 +{line},1 @@
-    def __new__(cls, device=None, priority=0, **kwargs):
+    def __new__(cls, device=None, priority=-1, **kwargs):
"""


def test_real_torch_files_apply_status_revert_match_record(torch_env, tmp_path):
    env, site = torch_env
    streams = site / "torch" / "cuda" / "streams.py"
    lines = streams.read_text().splitlines()
    line = lines.index("    def __new__(cls, device=None, priority=0, **kwargs):") + 1
    catalog = tmp_path / "catalog"
    write_patch(catalog, "torch/prio", [("all", ">=2.4", STREAM_DIFF_TEMPLATE.format(line=line))])
    record = pristine_hashes(site)
    rel = "torch/cuda/streams.py"
    assert record[rel] == hashlib.sha256(streams.read_bytes()).hexdigest()   # the copy is pristine

    run_cli("apply", "--target", str(env), "--patches", str(catalog), check=True)
    assert "priority=-1" in streams.read_text()
    assert record[rel] != hashlib.sha256(streams.read_bytes()).hexdigest()
    code, out = cli_json("status", "--target", str(env), "--patches", str(catalog))
    assert out["patches"][0]["state"] == "applied"

    run_cli("revert", "--target", str(env), "--patches", str(catalog), check=True)
    for path in sorted((site / "torch" / "cuda").glob("*.py")):
        assert record[str(path.relative_to(site))] == hashlib.sha256(path.read_bytes()).hexdigest(), path


def test_torch_reinstall_is_reported_lost_and_reapplied(torch_env, tmp_path):
    env, site = torch_env
    streams = site / "torch" / "cuda" / "streams.py"
    pristine = streams.read_bytes()
    line = streams.read_text().splitlines().index("    def __new__(cls, device=None, priority=0, **kwargs):") + 1
    catalog = tmp_path / "catalog"
    write_patch(catalog, "torch/prio", [("all", ">=2.4", STREAM_DIFF_TEMPLATE.format(line=line))])
    run_cli("apply", "--target", str(env), "--patches", str(catalog), check=True)
    streams.write_bytes(pristine)                         # pip install --force-reinstall torch
    code, out = cli_json("status", "--target", str(env), "--patches", str(catalog))
    assert code == 5 and out["patches"][0]["state"] == "lost"
    run_cli("apply", "--target", str(env), "--patches", str(catalog), check=True)
    assert "priority=-1" in streams.read_text()
    run_cli("revert", "--target", str(env), "--patches", str(catalog), check=True)
    assert streams.read_bytes() == pristine


def test_torch_found_through_a_pth_file_outside_site_packages(tmp_path):
    import subprocess as sp
    import sys
    env = tmp_path / "venv"
    sp.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = Path(sp.run([str(env / "bin" / "python"), "-I", "-c",
                        "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                       capture_output=True, text=True, check=True).stdout.strip())
    elsewhere = tmp_path / "shared-packages"
    (elsewhere / "torch").mkdir(parents=True)
    (elsewhere / "torch" / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\n")
    (site / "shared.pth").write_text(str(elsewhere) + "\n")
    found = detect(env, gpu=False)
    assert found.site_packages == elsewhere
    assert (found.torch_version, found.torch_cuda) == ("2.14.1+cu130", "13.0")


def test_state_folder_is_excluded_in_a_git_worktree(tmp_path):
    from shelltools import run_git
    comfy = make_comfy(tmp_path / "main", git=True)
    worktree = tmp_path / "wt"
    run_git(comfy, "worktree", "add", "-q", "--detach", str(worktree))
    catalog = make_catalog(tmp_path)
    run_cli("apply", "--target", str(worktree), "--patches", str(catalog), check=True)
    porcelain = run_git(worktree, "status", "--porcelain")
    assert ".applier" not in porcelain and "nodes.py" in porcelain


# ------------------------------------------------------------------ interpreters, nvidia-smi, detection files

GOOD_ANSWER = ('{"version": "%s", "prefix": "/p", "purelib": null, "platlib": null, "site": [], '
               '"torch_dir": null}')


def fake_program(folder: Path, name: str, body: str) -> Path:
    """An executable shell script standing in for an interpreter or nvidia-smi."""
    import stat as stat_module
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat_module.S_IXUSR)
    return path


def test_python_given_as_a_bare_or_dotted_name_is_the_file_in_the_working_directory_never_path(tmp_path,
                                                                                                monkeypatch):
    comfy = make_comfy(tmp_path / "install")
    fake_program(tmp_path / "on-path", "python", f"echo '{GOOD_ANSWER % '3.1.1'}'\n")
    here = fake_program(tmp_path / "cwd", "python", f"echo '{GOOD_ANSWER % '3.99.0'}'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'on-path'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path / "cwd")
    for given in ("python", "./python"):
        found = detect(comfy, python=given, gpu=False)
        assert (found.python, found.python_version) == (here, "3.99.0"), given


def test_a_missing_python_says_what_was_tried_and_never_looks_on_path(tmp_path, monkeypatch):
    from applier.errors import BadInterpreterError
    comfy = make_comfy(tmp_path / "install")
    fake_program(tmp_path / "on-path", "python9", f"echo '{GOOD_ANSWER % '3.1.1'}'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'on-path'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInterpreterError) as raised:
        detect(comfy, python="python9", gpu=False)
    assert raised.value.exit_code == 9
    assert str(tmp_path / "python9") in raised.value.message and "never searches PATH" in raised.value.message


def test_python_as_a_folder_is_exit_9_naming_the_interpreter_inside_it(tmp_path):
    comfy = make_comfy(tmp_path)
    venv = tmp_path / "env"
    fake_program(venv / "bin", "python3", f"echo '{GOOD_ANSWER % '3.11.0'}'\n")
    proc = run_cli("detect", "--target", str(comfy), "--python", str(venv))
    assert proc.returncode == 9, proc.stderr
    assert "is a folder" in proc.stderr and str(venv / "bin" / "python3") in proc.stderr
    proc = run_cli("detect", "--target", str(comfy), "--python", str(tmp_path / "nowhere" / "python"))
    assert proc.returncode == 9 and "does not exist" in proc.stderr


BAD_INTERPRETERS = {
    "non-utf8": ("printf '\\377\\376{}\\n'\n", "not UTF-8"),
    "a-list": ("echo '[1, 2]'\n", "not an object"),
    "no-version": ("echo '{\"prefix\": \"/p\"}'\n", "no 'version'"),
    "version-a-number": ("echo '{\"version\": 3, \"prefix\": \"/p\"}'\n", "not a Python version"),
    "site-a-string": ("echo '{\"version\": \"3.11.0\", \"prefix\": \"/p\", \"site\": \"/x\"}'\n", "'site'"),
    "prefix-missing": ("echo '{\"version\": \"3.11.0\"}'\n", "'prefix' is not a path"),
    "garbage": ("echo 'Python 2.7.18'\n", "not JSON"),
    "endless": ("yes\n", "printed more than"),
    "fails": ("echo 'boom' >&2; exit 3\n", "exited with status 3 when asked for its site-packages: boom"),
    "silent": ("true\n", "printed nothing"),
}


@pytest.mark.parametrize("case", list(BAD_INTERPRETERS))
def test_an_unusable_python_given_is_exit_9_saying_why(tmp_path, case):
    from applier.errors import BadInterpreterError
    body, why = BAD_INTERPRETERS[case]
    python = fake_program(tmp_path / "bin", "python", body)
    with pytest.raises(BadInterpreterError) as raised:
        detect(make_comfy(tmp_path), python=python, gpu=False)
    assert raised.value.exit_code == 9
    assert "not a usable Python interpreter" in raised.value.message and why in raised.value.message


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for a reaper does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_an_interpreter_that_never_answers_is_killed_with_its_children_at_the_detect_timeout(tmp_path,
                                                                                              monkeypatch):
    from applier.errors import BadInterpreterError
    pidfile = tmp_path / "grandchild.pid"
    python = fake_program(tmp_path / "bin", "python", f"sleep 60 &\necho $! > '{pidfile}'\nsleep 60\n")
    monkeypatch.setenv("APPLIER_DETECT_TIMEOUT", "0.5")
    with pytest.raises(BadInterpreterError) as raised:
        detect(make_comfy(tmp_path), python=python, gpu=False)
    assert "did not finish within 0.5 s" in raised.value.message
    pid = int(pidfile.read_text())
    import time
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "the interpreter's background child outlived the timeout"


@pytest.mark.parametrize("case", ["non-utf8", "no-version", "endless"])
def test_an_unusable_venv_interpreter_is_a_note_and_site_packages_come_from_the_layout(tmp_path, case):
    comfy = make_comfy(tmp_path)
    venv = comfy / "venv"
    fake_program(venv / "bin", "python3", BAD_INTERPRETERS[case][0])
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda = None\n")
    found = detect(comfy, gpu=False)
    assert found.python == venv / "bin" / "python3" and not found.python_usable
    assert BAD_INTERPRETERS[case][1] in found.python_problem
    assert found.site_packages == site and found.torch_version == "2.13.0+cpu"
    assert any("not a usable Python interpreter" in n and "--python" in n for n in found.notes)


def test_with_interpreter_replaces_the_python_part_and_its_notes(tmp_path):
    from applier.detect import with_interpreter
    comfy = make_comfy(tmp_path)
    found = detect(comfy, gpu=False)
    assert any("no Python environment" in n for n in found.notes)
    python = fake_program(tmp_path / "elsewhere" / "bin", "python", f"echo '{GOOD_ANSWER % '3.12.1'}'\n")
    again = with_interpreter(found, python, source="state")
    assert (again.python, again.python_source, again.python_version) == (python, "state", "3.12.1")
    assert not any("no Python environment" in n for n in again.notes)
    broken = fake_program(tmp_path / "broken" / "bin", "python", "echo '[]'\n")
    degraded = with_interpreter(found, broken, source="state")
    assert degraded.python_problem and "not an object" in degraded.python_problem


def test_paths_from_the_interpreter_keep_their_bytes_under_any_locale(tmp_path):
    """A non-ASCII venv path under LC_ALL=C without UTF-8 mode: the child's answer names the same bytes."""
    venv = tmp_path / "café" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from applier.detect import detect; "
            "f = detect(sys.argv[2], gpu=False); print(json.dumps([str(f.site_packages), f.python_version]))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent.parent), str(venv)],
                          capture_output=True, env={**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    site_packages, version = json.loads(proc.stdout)
    assert version is not None
    assert os.fsencode(site_packages) == os.fsencode(next(venv.glob("lib/python3*/site-packages")))


def test_nvidia_smi_that_floods_hangs_or_prints_garbage_leaves_the_gpu_unknown(tmp_path, monkeypatch):
    from applier.detect import probe_gpus
    monkeypatch.delenv("APPLIER_NO_GPU_PROBE", raising=False)
    monkeypatch.setenv("APPLIER_DETECT_TIMEOUT", "0.5")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for body, why in (("printf 'NVIDIA \\377\\376, 8.9, 24564\\n'\n", "not UTF-8"), ("yes\n", "printed more than"),
                      ("sleep 30\n", "did not finish within 0.5 s"), ("echo 'no driver' >&2; exit 9\n", "status 9")):
        fake_program(tmp_path, "nvidia-smi", body)
        gpus, problem = probe_gpus()
        assert gpus == [] and problem.startswith("GPU unknown") and why in problem, (body, problem)
    fake_program(tmp_path, "nvidia-smi", "echo 'NVIDIA GeForce RTX 4090, 8.9, 24564'\n")
    assert probe_gpus() == ([GPU("NVIDIA GeForce RTX 4090", "8.9", 24564)], None)


def test_a_5000_character_version_is_reported_unrecognised(tmp_path):
    comfy = make_comfy(tmp_path, version=None)
    (comfy / "comfyui_version.py").write_text('__version__ = "0.' + "9" * 5000 + '"\n')
    found = detect(comfy, gpu=False)
    assert found.comfyui_version is None
    assert any("comfyui_version.py says" in n and "not a version applier recognises" in n for n in found.notes)
    (comfy / "comfyui_version.py").write_text("__version__ = 1" + "+1" * 100000 + "\n")
    assert detect(comfy, gpu=False).comfyui_version is None     # too deep for ast (RecursionError): no crash


def test_detection_files_that_are_fifos_or_too_large_are_notes(tmp_path, hang_guard):
    comfy = make_comfy(tmp_path, version=None)
    os.mkfifo(comfy / "comfyui_version.py")
    (comfy / "pyproject.toml").write_bytes(b"#" * (2 * 1024 * 1024))
    found = detect(comfy, gpu=False)
    assert found.comfyui_version is None
    assert any("FIFO" in n for n in found.notes) and any("pyproject.toml" in n for n in found.notes)


def test_a_target_that_is_a_file_names_its_folder(tmp_path):
    comfy = make_comfy(tmp_path)
    proc = run_cli("status", "--target", str(comfy / "nodes.py"))
    assert proc.returncode == 9
    assert f"--target {comfy}" in proc.stderr


def test_a_folder_holding_two_comfyui_folders_is_refused_naming_both(tmp_path):
    first = make_comfy(tmp_path)
    second = tmp_path / "ComfyUI-copy"
    import shutil
    shutil.copytree(first, second)
    proc = run_cli("status", "--target", str(tmp_path))
    assert proc.returncode == 9, proc.stderr
    assert str(first) in proc.stderr and str(second) in proc.stderr
    assert detect(first, gpu=False).root == first          # each one named on its own is fine


def test_a_record_with_garbage_digests_or_a_nul_is_read_as_far_as_it_makes_sense(tmp_path):
    from applier.store.record import read_record
    record = tmp_path / "RECORD"
    good = "torch/a.py,sha256=" + "A" * 43 + ",10\n"
    record.write_text("torch/x.py,sha256=!!!*,12\n" + good)
    assert list(read_record(record)) == ["torch/a.py"]
    record.write_bytes(b"torch/x.py,sha256=\0,12\n")
    assert read_record(record) == {}


# ------------------------------------------------------------------ applier.subproc, the runner under all of it

def test_a_child_that_exits_while_its_own_child_holds_the_pipes_is_done_and_the_group_ended(tmp_path):
    from applier.subproc import run_bounded
    pidfile = tmp_path / "daemon.pid"
    script = fake_program(tmp_path, "leaves-a-daemon", f"sleep 60 &\necho $! > '{pidfile}'\necho done\n")
    result = run_bounded([script], timeout=30)
    assert (result.returncode, result.text()) == (0, "done\n")
    assert result.duration_s < 25, "waited for the daemon instead of the child"
    pid = int(pidfile.read_text())
    import time
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "the daemon holding the pipes outlived the run"


def test_stderr_past_its_cap_keeps_the_tail_or_is_an_overflow(tmp_path):
    from applier.errors import ChildFailure
    from applier.subproc import run_bounded
    script = fake_program(tmp_path, "noisy", "head -c 300000 /dev/zero | tr '\\0' x >&2; echo END >&2; echo ok\n")
    result = run_bounded([script], timeout=30, stderr_limit=1000, stderr_tail=True)
    assert result.text() == "ok\n" and result.stderr_truncated
    assert len(result.stderr) == 1000 and result.stderr.endswith(b"END\n")
    with pytest.raises(ChildFailure) as raised:
        run_bounded([script], timeout=30, stderr_limit=1000)
    assert raised.value.reason == "overflow" and "on stderr" in raised.value.message


@pytest.mark.parametrize("argv, why", [(["/nonexistent/program"], "No such file"), (["sh", "-c", "x\0y"], "null")])
def test_a_child_that_cannot_start_is_a_child_failure_saying_why(argv, why):
    from applier.errors import ChildFailure
    from applier.subproc import run_bounded
    with pytest.raises(ChildFailure) as raised:
        run_bounded(argv, timeout=5)
    assert raised.value.reason == "cannot-start" and why in raised.value.message and raised.value.exit_code == 9


def test_paths_cross_to_and_from_a_utf8_mode_child_byte_for_byte():
    from applier.subproc import path_from_child, text_for_child
    odd = os.fsdecode(b"/tmp/caf\xc3\xa9/\xff\xfe")          # one valid UTF-8 name, one that is not UTF-8 at all
    assert os.fsencode(path_from_child(text_for_child(odd))) == b"/tmp/caf\xc3\xa9/\xff\xfe"
    for bad in ("a\0b", "\ud800"):
        with pytest.raises(ValueError):
            path_from_child(bad)


def test_timeouts_from_the_environment_only_ever_lower_the_default(monkeypatch):
    from applier.subproc import timeout_from_env
    for value, expected in (("0.5", 0.5), ("100", 20), ("nonsense", 20), ("-1", 20), ("", 20)):
        monkeypatch.setenv("APPLIER_DETECT_TIMEOUT", value)
        assert timeout_from_env(20, "APPLIER_DETECT_TIMEOUT") == expected, value


def test_a_folder_inside_an_install_belongs_to_it_even_when_it_holds_comfyui_look_alikes(tmp_path):
    comfy = make_comfy(tmp_path)
    for name in ("node-a", "node-b"):                 # custom nodes that happen to ship nodes.py and execution.py
        make_comfy(comfy / "custom_nodes" / name)
    assert detect(comfy / "custom_nodes", gpu=False).root == comfy
