"""The probe runner: whatever a probe does (crash, hang, garbage, a verdict), verify gets a result, never a raise."""
from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from applier.resources import load_verify

verify = load_verify()
Outcome = verify.Outcome
run_probe = verify.runner.run_probe

ARGS = {"device": "cpu", "comfyui_root": None, "site_packages": None, "expect": {"applied": False}}

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="fake interpreters are shell scripts")


def fake_python(tmp_path: Path, body: str, name: str = "python") -> Path:
    """An executable standing in for the target's interpreter; it ignores the probe it is given."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@posix_only
def test_valid_verdict_is_passed_through_with_numbers(tmp_path):
    python = fake_python(tmp_path, """\
        echo "some chatter before the verdict"
        echo '{"outcome": "WARN", "reason": "looked odd", "numbers": {"priority": -1}}'
    """)
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.WARN
    assert result.reason == "looked odd"
    assert result.numbers == {"priority": -1}
    assert result.returncode == 0


@posix_only
def test_crash_by_signal_is_a_fail_naming_the_signal_and_keeping_stderr(tmp_path):
    python = fake_python(tmp_path, """\
        echo "Fatal Python error: Segmentation fault" >&2
        kill -SEGV $$
    """)
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.FAIL
    assert "SIGSEGV" in result.reason
    assert "Segmentation fault" in result.stderr


@posix_only
def test_nonzero_exit_is_a_fail_even_after_a_verdict_line(tmp_path):
    python = fake_python(tmp_path, """\
        echo '{"outcome": "PASS", "reason": "fine", "numbers": {}}'
        echo "Traceback: ImportError: no module named torch" >&2
        exit 3
    """)
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.FAIL
    assert "exited with status 3" in result.reason
    assert "ImportError" in result.reason


@posix_only
def test_hang_is_killed_at_the_timeout_and_is_a_fail(tmp_path):
    python = fake_python(tmp_path, """\
        echo "starting" >&2
        sleep 60
    """)
    result = run_probe(python, "stream_priority", ARGS, timeout=0.5)
    assert result.outcome is Outcome.FAIL
    assert "did not finish within 0.5 s" in result.reason
    assert result.returncode is None


@posix_only
@pytest.mark.parametrize("output, problem", [
    ("hello world", "not JSON"),
    ("[1, 2, 3]", "not an object"),
    ('{"outcome": "GREAT", "reason": "x", "numbers": {}}', "unknown outcome"),
    ('{"outcome": "PASS", "reason": 3, "numbers": {}}', "'reason' must be a string"),
    ("", "stdout was empty"),
])
def test_garbage_output_is_a_fail_saying_what_was_wrong(tmp_path, output, problem):
    python = fake_python(tmp_path, f"printf '%s\\n' '{output}'\n" if output else "true\n")
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.FAIL
    assert "printed no verdict" in result.reason
    assert problem in result.reason


def test_no_interpreter_is_a_skip():
    result = run_probe(None, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.SKIP
    assert "no Python interpreter" in result.reason


def test_missing_interpreter_file_is_a_skip(tmp_path):
    result = run_probe(tmp_path / "venv" / "bin" / "python", "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.SKIP
    assert "does not exist" in result.reason


@pytest.mark.parametrize("name", ["no_such_probe", "../runner", "a/b", ""])
def test_unknown_or_unsafe_probe_name_is_a_fail(name):
    result = run_probe(Path(sys.executable), name, ARGS, timeout=30)
    assert result.outcome is Outcome.FAIL
    assert "no probe named" in result.reason


def test_real_probe_gets_json_args_isolated_mode_a_temp_cwd_and_extra_env(tmp_path, monkeypatch):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "echo_args.py").write_text(textwrap.dedent("""\
        import json, os, sys
        args = json.loads(sys.argv[1])
        print(json.dumps({"outcome": "PASS", "reason": "echo", "numbers": {
            "args": args, "isolated": sys.flags.isolated, "cwd": os.getcwd(),
            "extra": os.environ.get("APPLIER_TEST_EXTRA"), "pythonpath": os.environ.get("PYTHONPATH")}}))
    """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "leak"))
    result = run_probe(Path(sys.executable), "echo_args", ARGS, timeout=60,
                       env_extra={"APPLIER_TEST_EXTRA": "yes"}, probes_dir=probes)
    assert result.outcome is Outcome.PASS, result.stderr
    numbers = result.numbers
    assert numbers["args"] == ARGS
    assert numbers["isolated"] == 1
    assert numbers["extra"] == "yes"
    assert numbers["pythonpath"] is None
    assert Path(numbers["cwd"]).resolve() != Path.cwd().resolve()
    assert not Path(numbers["cwd"]).exists()      # the temporary folder is removed afterwards


def needs_a_module_from_pythonpath(tmp_path: Path, monkeypatch) -> Path:
    """A probe that imports a module found only through PYTHONPATH, with PYTHONPATH (and PYTHONINSPECT) set."""
    probes, extra = tmp_path / "probes", tmp_path / "extra"
    probes.mkdir()
    extra.mkdir()
    (extra / "only_on_pythonpath.py").write_text("VALUE = 7\n")
    (probes / "imports_extra.py").write_text(textwrap.dedent("""\
        import json, sys
        import only_on_pythonpath
        print(json.dumps({"outcome": "PASS", "reason": "imported", "numbers": {
            "value": only_on_pythonpath.VALUE, "isolated": sys.flags.isolated}}))
    """))
    monkeypatch.setenv("PYTHONPATH", str(extra))
    monkeypatch.setenv("PYTHONINSPECT", "1")      # honoured without -I: it must still be dropped
    return probes


def test_a_probe_runs_without_pythonpath_and_its_missing_module_failure_says_how_to_keep_it(tmp_path, monkeypatch):
    probes = needs_a_module_from_pythonpath(tmp_path, monkeypatch)
    result = run_probe(Path(sys.executable), "imports_extra", ARGS, timeout=60, probes_dir=probes)
    assert result.outcome is Outcome.FAIL and "only_on_pythonpath" in result.reason
    assert "PYTHONPATH" in result.reason and "--keep-pythonpath" in result.reason


def test_keep_pythonpath_passes_pythonpath_on_and_still_drops_the_other_python_variables(tmp_path, monkeypatch):
    probes = needs_a_module_from_pythonpath(tmp_path, monkeypatch)
    result = run_probe(Path(sys.executable), "imports_extra", ARGS, timeout=30, probes_dir=probes,
                       keep_pythonpath=True)
    assert result.outcome is Outcome.PASS, result.reason + result.stderr
    assert result.numbers == {"value": 7, "isolated": 0}


def test_probe_raising_without_a_verdict_is_a_fail_with_the_traceback(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "raises.py").write_text("import json\nraise RuntimeError('torch is broken')\n")
    result = run_probe(Path(sys.executable), "raises", ARGS, timeout=60, probes_dir=probes)
    assert result.outcome is Outcome.FAIL
    assert "exited with status 1" in result.reason
    assert "RuntimeError: torch is broken" in result.stderr


def test_stderr_is_kept_as_a_bounded_tail(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "noisy.py").write_text(textwrap.dedent("""\
        import sys, json
        sys.stderr.write("x" * 100000 + "END")
        print(json.dumps({"outcome": "SKIP", "reason": "no CUDA", "numbers": {}}))
    """))
    result = run_probe(Path(sys.executable), "noisy", ARGS, timeout=60, probes_dir=probes)
    assert result.outcome is Outcome.SKIP
    assert result.stderr.endswith("END")
    assert len(result.stderr) == verify.runner.STDERR_TAIL_CHARS


def test_to_check_carries_the_verdict_under_the_check_name():
    probe = verify.runner.ProbeResult(Outcome.PASS, "ok", {"n": 1}, "warn line", 0.25, 0)
    result = probe.to_check("effect:torch/stream-priority")
    assert (result.name, result.outcome, result.reason, result.numbers, result.stderr) == \
        ("effect:torch/stream-priority", Outcome.PASS, "ok", {"n": 1}, "warn line")
    assert json.loads(json.dumps(result.to_json()))["outcome"] == "PASS"


@posix_only
def test_endless_stdout_is_killed_at_the_cap_and_is_a_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(verify.runner, "PROBE_STDOUT_LIMIT", 64 * 1024)
    python = fake_python(tmp_path, "yes\n")
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.FAIL
    assert "printed more than 64 KiB on stdout (killed)" in result.reason


@posix_only
def test_a_verdict_with_bytes_that_are_not_utf8_is_a_fail_saying_so(tmp_path):
    python = fake_python(tmp_path, """printf '{"outcome": "PASS", "reason": "\\377", "numbers": {}}\\n'\n""")
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.FAIL
    assert "not UTF-8" in result.reason


@posix_only
def test_endless_stderr_keeps_a_tail_and_the_verdict_still_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(verify.runner, "PROBE_STDERR_KEPT", 64 * 1024)
    python = fake_python(tmp_path, """\
        head -c 1000000 /dev/zero | tr '\\0' 'x' >&2
        echo "LAST" >&2
        echo '{"outcome": "PASS", "reason": "fine", "numbers": {}}'
    """)
    result = run_probe(python, "stream_priority", ARGS, timeout=30)
    assert result.outcome is Outcome.PASS, result.reason
    assert result.stderr.rstrip().endswith("LAST")


def test_a_probe_s_temp_files_and_inductor_cache_go_with_it(tmp_path, monkeypatch):
    """torch.compile puts its cache in $TMPDIR/torchinductor_<user> unless told: the probe's own folder is both."""
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "litters.py").write_text(textwrap.dedent("""\
        import json, os, tempfile
        litter = os.path.join(tempfile.gettempdir(), "torchinductor_test")
        os.makedirs(litter)
        print(json.dumps({"outcome": "PASS", "reason": "made a mess", "numbers": {
            "temp": tempfile.gettempdir(), "inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}}))
    """))
    shared_temp = tmp_path / "tmp"
    shared_temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(shared_temp))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)     # this process reads TMPDIR again
    result = run_probe(Path(sys.executable), "litters", ARGS, timeout=60, probes_dir=probes)
    assert result.outcome is Outcome.PASS, result.stderr
    assert Path(result.numbers["inductor"]).parent == Path(result.numbers["temp"])
    assert list(shared_temp.iterdir()) == [], "the probe left files in the shared temp folder"


def test_a_probe_gets_its_paths_as_its_utf8_mode_names_them(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "lists.py").write_text(textwrap.dedent("""\
        import json, os, sys
        args = json.loads(sys.argv[1])
        print(json.dumps({"outcome": "PASS", "reason": "listed", "numbers": {
            "utf8_mode": sys.flags.utf8_mode, "entries": os.listdir(args["comfyui_root"])}}))
    """))
    folder = tmp_path / "café"
    folder.mkdir()
    (folder / "nodes.py").write_text("")
    result = run_probe(Path(sys.executable), "lists", {**ARGS, "comfyui_root": str(folder)}, timeout=60,
                       probes_dir=probes)
    assert result.outcome is Outcome.PASS, result.stderr
    assert result.numbers == {"utf8_mode": 1, "entries": ["nodes.py"]}


@posix_only
def test_the_oom_retry_probe_refuses_a_fifo_execution_py_at_once(tmp_path):
    import os
    root = tmp_path / "ComfyUI"
    root.mkdir()
    os.mkfifo(root / "execution.py")
    result = run_probe(Path(sys.executable), "oom_retry", {**ARGS, "comfyui_root": str(root)}, timeout=20)
    assert result.outcome is Outcome.FAIL, result
    assert "cannot read execution.py" in result.reason and "not a regular file" in result.reason


@posix_only
def test_the_comfy_import_probe_refuses_a_fifo_nodes_py_at_once(tmp_path):
    import os
    root = tmp_path / "ComfyUI"
    root.mkdir()
    os.mkfifo(root / "nodes.py")
    result = run_probe(Path(sys.executable), "comfy_import", {**ARGS, "comfyui_root": str(root)}, timeout=20)
    assert result.outcome is Outcome.FAIL, result
    assert "not a regular file" in result.reason


def test_a_verdict_reason_as_long_as_a_log_is_cut_to_one_report_line(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "chatty.py").write_text('import json\nprint(json.dumps({"outcome": "PASS", "reason": "x" * 100000, '
                                      '"numbers": {}}))\n')
    result = run_probe(Path(sys.executable), "chatty", ARGS, timeout=60, probes_dir=probes)
    assert result.outcome is Outcome.PASS
    assert len(result.reason) < verify.runner.MAX_REASON_CHARS + 40 and result.reason.endswith("(100000 characters)")
