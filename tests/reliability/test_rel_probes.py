"""Section 8 (reliability round 2): interpreters and probes. Every program applier runs (the target's interpreter,
git, nvidia-smi, verify probes) may print garbage, bytes that are not UTF-8, endless output, or never answer; every
file detection reads may be a FIFO, a device or absurdly long; the locale may be C with a non-ASCII path. Each case
runs the CLI as a user does (a subprocess with a deadline) and must end within it, with a documented exit code
(applier/errors.py) and no traceback. Short timeouts: APPLIER_DETECT_TIMEOUT for detection, --timeout for verify."""
from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reltools import DOCUMENTED, NODES_PY, Outcome, assert_clean, child_env, make_install, run, snapshot

pytestmark = pytest.mark.slow

FAST = {"APPLIER_DETECT_TIMEOUT": "2"}
DEADLINE_S = 60          # what each command is given before the test calls it a hang
VERIFY_CODES = (*DOCUMENTED, 6)
SITE_ANSWER = ('{"version": "3.11.9", "prefix": "/p", "purelib": null, "platlib": null, "site": [], '
               '"torch_dir": null}')

# class -> (the fake interpreter's shell body, what the error must say)
BAD_INTERPRETERS = {
    "non-utf8": ("printf '\\377\\376\\n'\n", "not UTF-8"),
    "wrong-shape": ("echo '[\"/usr\", 3]'\n", "not an object"),
    "no-version": ("echo '{\"prefix\": \"/usr\", \"site\": []}'\n", "no 'version'"),
    "endless": ("yes 'lorem ipsum'\n", "printed more than"),
    "never-answers": ("sleep 600\n", "did not finish within 2 s"),
    "children-never-answer": ("sleep 600 &\nsleep 600 &\nwait\n", "did not finish within 2 s"),
    "crashes": ("echo 'Fatal Python error: init_fs_encoding' >&2; exit 1\n", "exited with status 1"),
    "deep-json": ("python3 -c \"print('[' * 100000 + ']' * 100000)\"\n", "not JSON"),
}


def fake_program(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def ends_clean(*args, allowed=DOCUMENTED, env=None, cwd=None, **kw):
    """The CLI in a subprocess (in `cwd` when given) that must end within DEADLINE_S, cleanly."""
    if cwd is None:
        out = run(*args, env={**FAST, **(env or {})}, timeout=DEADLINE_S, **kw)
    else:
        args = tuple(str(a) for a in args)
        proc = subprocess.run([sys.executable, "-m", "applier", *args], capture_output=True, text=True, cwd=cwd,
                              env=child_env({**FAST, **(env or {})}), timeout=DEADLINE_S, **kw)
        out = Outcome(args, proc.returncode, proc.stdout, proc.stderr)
    return assert_clean(out, allowed=allowed)


# ------------------------------------------------------------------------------ an interpreter given with --python

@pytest.mark.parametrize("case", list(BAD_INTERPRETERS))
def test_a_bad_python_given_is_exit_9_saying_why(plain, tmp_path, case):
    body, why = BAD_INTERPRETERS[case]
    python = fake_program(tmp_path / "bin", "python", body)
    for command in ("detect", "status", "apply", "verify"):
        out = ends_clean(*plain.args(command), "--python", python, allowed=(9,))
        assert "not a usable Python interpreter" in out.stderr and why in out.stderr, out
    assert snapshot(plain.root)[0] == plain.base_files


def test_python_as_a_folder_missing_or_not_executable_is_exit_9(plain, tmp_path):
    venv = tmp_path / "env"
    fake_program(venv / "bin", "python3", f"echo '{SITE_ANSWER}'\n")
    out = ends_clean(*plain.args("status"), "--python", venv, allowed=(9,))
    assert "is a folder" in out.stderr and str(venv / "bin" / "python3") in out.stderr
    out = ends_clean(*plain.args("status"), "--python", tmp_path / "missing", allowed=(9,))
    assert "does not exist" in out.stderr
    (tmp_path / "plain-file").write_text("#!/bin/sh\n")
    out = ends_clean(*plain.args("status"), "--python", tmp_path / "plain-file", allowed=(9,))
    assert "not executable" in out.stderr
    os.mkfifo(tmp_path / "fifo")
    out = ends_clean(*plain.args("status"), "--python", tmp_path / "fifo", allowed=(9,))
    assert "not a regular file" in out.stderr


def test_a_relative_python_is_taken_from_the_working_directory_not_path(plain, tmp_path):
    cwd = tmp_path / "work"
    fake_program(cwd, "python", f"echo '{SITE_ANSWER}'\n")
    decoy = fake_program(tmp_path / "decoy", "python", "echo '{\"version\": \"3.0.1\", \"prefix\": \"/decoy\"}'\n")
    env = {"PATH": f"{decoy.parent}{os.pathsep}{os.environ['PATH']}"}
    for given in ("python", "./python"):
        out = ends_clean("detect", "--json", "--target", plain.root, "--python", given, env=env, cwd=cwd,
                         allowed=(0,))
        data = out.json()
        assert (data["python"], data["python_version"]) == (str(cwd / "python"), "3.11.9")
    out = ends_clean("detect", "--target", plain.root, "--python", "python3", env=env, cwd=cwd, allowed=(9,))
    assert str(cwd / "python3") in out.stderr and "never searches PATH" in out.stderr


# ------------------------------------------------------------------------------ a broken interpreter in venv/

def break_venv(inst, body: str) -> None:
    for name in ("python", "python3"):
        fake_program(inst.comfy / "venv" / "bin", name, body)


@pytest.mark.parametrize("case", ["non-utf8", "wrong-shape", "no-version", "endless", "never-answers"])
def test_a_broken_venv_python_never_makes_revert_impossible(tmp_path, case):
    inst = make_install(tmp_path / "t", layout="venv")
    assert_clean(run(*inst.args("apply"), env=FAST, timeout=DEADLINE_S), allowed=(0,))
    break_venv(inst, BAD_INTERPRETERS[case][0])
    out = ends_clean(*inst.args("detect"), allowed=(0,))
    assert "not a usable Python interpreter" in out.stdout and "--python" in out.stdout
    assert "(venv) not usable: see the note" in out.stdout
    for command in (("status",), ("list",), ("overlay", "list")):
        ends_clean(*inst.args(*command), allowed=(0,))
    out = ends_clean(*inst.args("verify", "--timeout", "5"), allowed=VERIFY_CODES)
    assert "Traceback" not in out.text
    ends_clean(*inst.args("revert"), allowed=(0,))
    assert (inst.comfy / "nodes.py").read_text() == NODES_PY


def test_an_interpreter_recorded_with_python_that_breaks_later_blocks_no_revert(plain, tmp_path):
    python = fake_program(tmp_path / "env" / "bin", "python", f"echo '{SITE_ANSWER}'\n")
    ends_clean(*plain.args("apply"), "--python", python, allowed=(0,))
    fake_program(tmp_path / "env" / "bin", "python", BAD_INTERPRETERS["endless"][0])
    out = ends_clean(*plain.args("status"), allowed=(0,))
    ends_clean(*plain.args("revert"), allowed=(0,))
    assert (plain.comfy / "nodes.py").read_text() == NODES_PY, out


def test_verify_only_effect_with_every_check_skipped_is_exit_6_naming_python(plain):
    """The packaged catalog, whose every patch has an effect probe, on an install without an interpreter."""
    out = ends_clean("verify", "--only", "effect", "--target", plain.root, allowed=(6,))
    assert "nothing was verified" in out.stdout
    out = ends_clean("verify", "--only", "effect", "--json", "--target", plain.root, allowed=(6,))
    report = out.json()
    assert report["ok"] is False and report["checks"]
    for check in report["checks"]:
        assert check["outcome"] == "SKIP" and "--python" in check["reason"], check


# ------------------------------------------------------------------------------ nvidia-smi

@pytest.mark.parametrize("body, why", [
    ("printf 'NVIDIA \\377\\376, 8.9, 24564\\n'\n", "not UTF-8"),
    ("yes 'NVIDIA H200, 9.0, 143771'\n", "printed more than"),
    ("sleep 600\n", "did not finish within 2 s"),
    ("sleep 600 & wait\n", "did not finish within 2 s"),
])
def test_an_nvidia_smi_that_misbehaves_leaves_the_gpu_unknown(plain, tmp_path, body, why):
    fake_program(tmp_path / "bin", "nvidia-smi", body)
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "APPLIER_NO_GPU_PROBE": "0"}
    data = ends_clean("detect", "--json", "--target", plain.root, env=env, allowed=(0,)).json()
    assert data["gpus"] == [] and data["gpu_problem"].startswith("GPU unknown") and why in data["gpu_problem"]
    text = ends_clean("detect", "--target", plain.root, env=env, allowed=(0,)).stdout
    assert "unknown (see the note)" in text and "note: GPU unknown" in text


# ------------------------------------------------------------------------------ the locale

def test_lc_all_c_with_a_non_ascii_venv_path(tmp_path):
    inst = make_install(tmp_path / "café über", layout="venv")
    env = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    data = ends_clean(*inst.args("detect", "--json"), env=env, allowed=(0,)).json()
    assert data["python_version"] and os.fsencode(data["site_packages"]) == os.fsencode(inst.site)
    for command in (("apply",), ("status",), ("overlay", "install"), ("overlay", "list"), ("overlay", "uninstall"),
                    ("revert",)):
        ends_clean(*inst.args(*command), env=env, allowed=(0,))
    ends_clean(*inst.args("verify", "--timeout", "30"), env=env, allowed=VERIFY_CODES)
    assert snapshot(inst.root)[0] == inst.base_files


# ------------------------------------------------------------------------------ files detection and verify read

def test_fifos_in_place_of_detection_files_end_every_command(tmp_path):
    inst = make_install(tmp_path / "t", layout="venv")
    (inst.comfy / "comfyui_version.py").unlink()
    os.mkfifo(inst.comfy / "comfyui_version.py")
    os.mkfifo(inst.comfy / "pyproject.toml")
    (inst.site / "torch").mkdir()
    os.mkfifo(inst.site / "torch" / "version.py")
    (inst.site / "torch-2.13.0.dist-info").mkdir()
    os.mkfifo(inst.site / "torch-2.13.0.dist-info" / "METADATA")
    out = ends_clean(*inst.args("detect"), allowed=(0,))
    assert "FIFO" in out.stdout
    for command in (("status",), ("apply",), ("revert",)):
        ends_clean(*inst.args(*command), allowed=(0, 5))


def test_verify_skips_special_and_outside_custom_node_files_with_a_warn(plain, tmp_path):
    nodes = plain.comfy / "custom_nodes" / "pack"
    nodes.mkdir()
    os.mkfifo(nodes / "fifo.py")
    (nodes / "zero.py").symlink_to("/dev/zero")
    (tmp_path / "secret.py").write_text("MAX_RESOLUTION = 4096\n")
    (nodes / "outside.py").symlink_to(tmp_path / "secret.py")

    def limit_memory():          # were /dev/zero read, the run would fail here instead of eating the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    out = ends_clean(*plain.args("verify", "--json", "--only", "resolution-caps"), allowed=(0,),
                     preexec_fn=limit_memory)
    (check,) = out.json()["checks"]
    assert check["outcome"] == "WARN" and check["numbers"]["caps"] == []
    assert sorted(s.split(":")[0] for s in check["numbers"]["skipped"]) == [
        "custom_nodes/pack/fifo.py", "custom_nodes/pack/outside.py", "custom_nodes/pack/zero.py"]


def test_a_fifo_nodes_py_in_verify_is_a_fail_not_a_hang(plain):
    (plain.comfy / "nodes.py").unlink()
    os.mkfifo(plain.comfy / "nodes.py")
    (plain.comfy / "comfy").mkdir()          # still a ComfyUI folder (execution.py beside comfy/)
    out = ends_clean(*plain.args("verify", "--only", "max-resolution"), allowed=(6,))
    assert "FIFO" in out.stdout


def test_a_5000_character_version_breaks_no_command(plain):
    (plain.comfy / "comfyui_version.py").write_text('__version__ = "0.' + "9" * 5000 + '"\n')
    out = ends_clean(*plain.args("detect"), allowed=(0,))
    assert "not a version applier recognises" in out.stdout
    for command in (("list",), ("status",), ("apply",), ("verify",), ("revert",)):
        ends_clean(*plain.args(*command), allowed=VERIFY_CODES)


# ------------------------------------------------------------------------------ probes

def test_verify_real_import_leaves_no_inductor_cache_in_tmpdir(plain, tmp_path):
    """The probe (here a stand-in interpreter that litters like torch.compile) gets a temp folder of its own."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    python = fake_program(tmp_path / "bin", "python", f"""\
case "$*" in
  *" -c "*) echo '{SITE_ANSWER}' ;;
  *) mkdir -p "${{TMPDIR:-/tmp}}/torchinductor_$(id -un)" "$TORCHINDUCTOR_CACHE_DIR"
     echo '{{"outcome": "PASS", "reason": "imported", "numbers": {{"max_resolution": 16384,
       "empty_latent_width_max": 16384}}}}' | tr -d '\\n'; echo ;;
esac
""")
    ends_clean(*plain.args("verify", "--real-import", "--timeout", "10", "--python", python),
               env={"TMPDIR": str(shared)}, allowed=VERIFY_CODES)
    assert sorted(os.listdir(shared)) == [], "verify left files in TMPDIR"


@pytest.mark.parametrize("body, why", [
    ("sleep 600 & sleep 600\n", "did not finish within 3 s"),
    ("yes\n", "printed more than"),
    ("printf '\\377\\n'\n", "not UTF-8"),
])
def test_a_probe_that_hangs_floods_or_prints_garbage_is_a_fail(plain, tmp_path, body, why):
    python = fake_program(tmp_path / "bin", "python", f"""\
case "$*" in
  *" -c "*) echo '{SITE_ANSWER}' ;;
  *) {body.strip()} ;;
esac
""")
    out = ends_clean(*plain.args("verify", "--real-import", "--timeout", "3", "--only", "max-resolution",
                                 "--json", "--python", python), allowed=(6,))
    (check,) = out.json()["checks"]
    assert check["outcome"] == "FAIL" and why in check["reason"], check


def test_detect_json_of_a_healthy_install_says_nothing_is_wrong(tmp_path):
    inst = make_install(tmp_path / "t", layout="venv")
    data = ends_clean(*inst.args("detect", "--json"), allowed=(0,)).json()
    assert data["python_problem"] is None and data["gpu_problem"] is None
    assert json.dumps(data)
