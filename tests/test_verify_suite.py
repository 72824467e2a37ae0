"""run_verify as a whole: selection, progress, effect probe arguments, outcomes and the --json document."""
from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from applier.catalog import load_catalog
from applier.errors import RefusedError
from applier.resources import REPO_ROOT, load_verify
from applier.store.applied import AppliedPatch, State
from applier.target import Target

verify = load_verify()
registry = verify.registry
Outcome = verify.Outcome
CheckResult = verify.CheckResult


def make_catalog(tmp_path: Path, probe: str = "stream_priority") -> list:
    folder = tmp_path / "catalog" / "torch" / "fake-patch"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(textwrap.dedent(f"""\
        title = "A torch patch"
        effect_probe = "{probe}"
        [[variant]]
        name = "all"
        versions = ">=2"
        diff = "x.diff"
    """))
    (folder / "x.diff").write_text("--- a/torch/x.py\n+++ b/torch/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    return load_catalog(tmp_path / "catalog")


def make_target(tmp_path: Path, python: Path | None = None, torch: bool = True) -> Target:
    return Target(root=tmp_path, layout="python-env", comfyui_root=None, comfyui_version=None,
                  comfyui_version_source="unknown", comfyui_commit=None, python=python,
                  python_source="--python" if python else "none", python_version="3.11",
                  site_packages=tmp_path / "site-packages" if torch else None,
                  torch_version="2.13.0+cpu" if torch else None, torch_cuda=None, triton_version=None)


def echo_python(tmp_path: Path) -> Path:
    """A stand-in interpreter that answers PASS with the arguments and environment it was given."""
    path = tmp_path / "python"
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        flag, (script, payload) = sys.argv[1], sys.argv[-2:]
        print(json.dumps({{"outcome": "PASS", "reason": "echo", "numbers": {{
            "flag": flag, "script": os.path.basename(script), "args": json.loads(payload),
            "env_triton_interpret": os.environ.get("TRITON_INTERPRET")}}}}))
    """))
    path.chmod(0o755)
    return path


def state_with(patch_id: str) -> State:
    return State({patch_id: AppliedPatch(id=patch_id, variant="all", component="torch", files=[],
                                         component_version="2.13.0", applied_at="2026-11-30T00:00:00Z")})


def result(name, outcome):
    return CheckResult(name, outcome, "because")


# ------------------------------------------------------------------ outcomes

def test_overall_ok_is_true_iff_no_check_failed_and_something_was_verified():
    assert verify.overall_ok([result("a", Outcome.PASS), result("b", Outcome.WARN), result("c", Outcome.SKIP)])
    assert verify.overall_ok([result("a", Outcome.WARN), result("c", Outcome.SKIP)])
    assert not verify.overall_ok([result("a", Outcome.PASS), result("b", Outcome.FAIL)])
    assert verify.overall_ok([])


def test_a_run_where_every_check_skipped_is_not_ok():
    skipped = [result("a", Outcome.SKIP), result("b", Outcome.SKIP)]
    assert verify.nothing_verified(skipped)
    assert not verify.overall_ok(skipped)
    assert verify.results_to_json(skipped)["ok"] is False


def test_skip_is_never_counted_as_pass():
    counts = verify.summarize([result("a", Outcome.SKIP), result("b", Outcome.SKIP), result("c", Outcome.PASS)])
    assert counts == {"PASS": 1, "FAIL": 0, "WARN": 0, "SKIP": 2}


def test_a_crashing_check_becomes_a_fail_with_its_traceback():
    def broken(ctx):
        raise KeyError("numbers")
    instance = registry.CheckInstance("broken", registry.Check("broken", "raises", False, broken))
    outcome = instance.run(ctx=None)
    assert outcome.outcome is Outcome.FAIL
    assert "KeyError" in outcome.reason and "Traceback" in outcome.stderr


def test_registering_a_name_twice_is_refused():
    importlib.import_module("applier_verify.checks")    # the real "integrity" is registered first
    with pytest.raises(ValueError):
        registry.check("integrity", "again")(lambda ctx: None)


# ------------------------------------------------------------------ selection and progress

def test_every_check_runs_by_default_except_the_opt_in_kernel_parity(tmp_path):
    options = verify.VerifyOptions(target=make_target(tmp_path), catalog=make_catalog(tmp_path), state=State())
    names = [i.name for i in verify.plan_checks(options)]
    assert names == ["max-resolution", "resolution-caps", "integrity", "effect:torch/fake-patch"]
    options.kernels = True
    assert verify.plan_checks(options)[-1].name == "kernel-parity"


@pytest.mark.parametrize("only, expected", [
    (("effect",), ["effect:torch/fake-patch"]),
    (("torch/fake-patch",), ["effect:torch/fake-patch"]),
    (("effect:torch/fake-patch", "integrity"), ["integrity", "effect:torch/fake-patch"]),
    (("kernel-parity",), ["kernel-parity"]),
])
def test_only_selects_by_name_family_or_patch_id(tmp_path, only, expected):
    options = verify.VerifyOptions(target=make_target(tmp_path), catalog=make_catalog(tmp_path), only=only)
    assert [i.name for i in verify.plan_checks(options)] == expected


def test_unknown_only_name_is_refused_with_the_known_names(tmp_path):
    options = verify.VerifyOptions(target=make_target(tmp_path), catalog=[], only=("max-res",))
    with pytest.raises(RefusedError) as raised:
        verify.plan_checks(options)
    assert "max-resolution" in raised.value.hint


def test_progress_is_told_as_each_check_starts_and_as_it_ends(tmp_path):
    seen = []
    options = verify.VerifyOptions(target=make_target(tmp_path), catalog=make_catalog(tmp_path), state=State(),
                                   kernels=True, progress=seen.append)
    results = verify.run_verify(options)
    names = [r.name for r in results]
    assert [(s.name, s.result is None) for s in seen] == [(n, started) for n in names for started in (True, False)]
    assert [s.result for s in seen[1::2]] == results
    assert {(s.index, s.total) for s in seen} == {(i, len(names)) for i in range(1, len(names) + 1)}
    assert [s.name for s in seen[::2] if s.slow] == ["effect:torch/fake-patch", "kernel-parity"]


# ------------------------------------------------------------------ effect and kernel checks

def test_no_interpreter_makes_effect_and_kernel_checks_skip_naming_python_and_the_run_not_ok(tmp_path):
    options = verify.VerifyOptions(target=make_target(tmp_path), catalog=make_catalog(tmp_path), kernels=True)
    results = {r.name: r for r in verify.run_verify(options)}
    for name in ("effect:torch/fake-patch", "kernel-parity"):
        assert results[name].outcome is Outcome.SKIP
        assert "--python" in results[name].reason
    assert not verify.overall_ok(results.values())        # every check SKIPped: nothing was verified


def test_an_unusable_interpreter_skips_probes_naming_why_and_python(tmp_path):
    target = make_target(tmp_path, echo_python(tmp_path))
    target.python_problem = "this is not a usable Python interpreter: its answer has no 'version'"
    options = verify.VerifyOptions(target=target, catalog=make_catalog(tmp_path), kernels=True)
    results = {r.name: r for r in verify.run_verify(options)}
    for name in ("effect:torch/fake-patch", "kernel-parity"):
        assert results[name].outcome is Outcome.SKIP
        assert "no 'version'" in results[name].reason and "--python" in results[name].reason


def test_no_torch_in_the_target_skips_torch_effects(tmp_path):
    options = verify.VerifyOptions(target=make_target(tmp_path, echo_python(tmp_path), torch=False),
                                   catalog=make_catalog(tmp_path), only=("effect",))
    (effect,) = verify.run_verify(options)
    assert effect.outcome is Outcome.SKIP
    assert "torch is not installed" in effect.reason


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in interpreter relies on a shebang")
@pytest.mark.parametrize("applied", [True, False])
def test_effect_probe_runs_isolated_with_the_contract_arguments(tmp_path, applied):
    target = make_target(tmp_path, echo_python(tmp_path))
    state = state_with("torch/fake-patch") if applied else State()
    options = verify.VerifyOptions(target=target, catalog=make_catalog(tmp_path), state=state, device="cpu",
                                   only=("effect",))
    (effect,) = verify.run_verify(options)
    assert effect.outcome is Outcome.PASS, effect.reason
    assert effect.numbers["flag"] == "-I"
    assert effect.numbers["script"] == "stream_priority.py"
    args = effect.numbers["args"]
    assert args["device"] == "cpu"
    assert args["site_packages"] == str(tmp_path / "site-packages")
    assert args["comfyui_root"] is None
    assert args["expect"] == {"applied": applied}
    assert effect.numbers["expect_applied"] is applied


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in interpreter relies on a shebang")
@pytest.mark.parametrize("device, torch_cuda, interpret", [
    ("cpu", "13.0", "1"), ("auto", None, "1"), ("cuda", None, None), ("auto", "13.0", None)])
def test_kernel_parity_turns_on_the_triton_interpreter_only_where_no_gpu_can_answer(tmp_path, device, torch_cuda,
                                                                                   interpret):
    # With a CUDA build of torch and --device auto, the probe itself asks torch whether a GPU is there.
    target = make_target(tmp_path, echo_python(tmp_path))
    target.torch_cuda = torch_cuda
    options = verify.VerifyOptions(target=target, catalog=[], device=device, kernels=True, only=("kernel-parity",))
    (parity,) = verify.run_verify(options)
    assert parity.numbers["script"] == "kernel_parity.py"
    assert parity.numbers["env_triton_interpret"] == interpret
    assert parity.numbers["args"]["device"] == device


# ------------------------------------------------------------------ the --json document

def validate(instance, schema, root):
    """A small JSON-schema subset (type, const, enum, required, properties, additionalProperties, items, $ref)."""
    if "$ref" in schema:
        node = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return validate(instance, node, root)
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
             "boolean": bool, "null": type(None)}
    if "type" in schema:
        wanted = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert any(isinstance(instance, types[t]) for t in wanted), (instance, wanted)
    if "const" in schema:
        assert instance == schema["const"]
    if "enum" in schema:
        assert instance in schema["enum"]
    if isinstance(instance, dict):
        assert set(schema.get("required", ())) <= set(instance)
        if schema.get("additionalProperties") is False:
            assert set(instance) <= set(schema.get("properties", {})), set(instance)
        for key, sub in schema.get("properties", {}).items():
            if key in instance:
                validate(instance[key], sub, root)
    if isinstance(instance, list) and "items" in schema:
        for item in instance:
            validate(item, schema["items"], root)


def test_json_report_matches_the_documented_schema(tmp_path):
    target = make_target(tmp_path)
    options = verify.VerifyOptions(target=target, catalog=make_catalog(tmp_path), kernels=True)
    results = verify.run_verify(options) + [result("integrity-extra", Outcome.FAIL)]
    report = json.loads(json.dumps(verify.results_to_json(results, target)))
    schema = json.loads((REPO_ROOT / "docs" / "verify-schema.json").read_text())
    validate(report, schema, schema)
    assert report["ok"] is False
    assert report["summary"]["FAIL"] == 1
    assert len(report["checks"]) == len(results)


@pytest.mark.parametrize("patch_id", ["comfyui/max-resolution", "comfyui/pil-pixel-limit"])
def test_probes_that_import_comfyui_wait_for_real_import(tmp_path, patch_id):
    catalog = [p for p in load_catalog() if p.id == patch_id]
    target = make_target(tmp_path, echo_python(tmp_path))
    target.comfyui_root = tmp_path
    options = verify.VerifyOptions(target=target, catalog=catalog, only=("effect",))
    (effect,) = verify.run_verify(options)
    assert effect.outcome is Outcome.SKIP
    assert "--real-import" in effect.reason
    options.real_import = True
    (effect,) = verify.run_verify(options)
    assert effect.outcome is Outcome.PASS          # the stand-in interpreter answered
    assert effect.numbers["args"]["real_import"] is True


# ------------------------------------------------------------------ the command's progress

def run_verify_command(tmp_path: Path, *args: str, env: dict | None = None):
    from click.testing import CliRunner

    from applier.cli import cli
    from tests.fixtures.comfy_tree import build_comfy_tree
    comfy = build_comfy_tree(tmp_path / "ComfyUI", era="latest", layout="plain")
    return CliRunner().invoke(cli, ["verify", "--target", str(comfy), *args],
                              env={"APPLIER_NO_GPU_PROBE": "1", "PYTHONPATH": None, **(env or {})})


def test_verify_writes_a_line_per_check_to_stderr_as_it_starts_and_ends(tmp_path):
    result = run_verify_command(tmp_path)
    names = [line.split()[0] for line in result.stdout.splitlines()[:-1] if line and not line.startswith(" ")]
    assert names and "max-resolution" in names
    total = len(names)
    for index, name in enumerate(names, start=1):
        assert f"[{index}/{total}] {name} ...\n" in result.stderr
        assert f"[{index}/{total}] {name}: " in result.stderr
    assert "[1/" not in result.stdout


def test_verify_json_keeps_stdout_for_the_document(tmp_path):
    result = run_verify_command(tmp_path, "--json")
    document = json.loads(result.stdout)
    assert document["checks"] and "[1/" not in result.stdout


def test_verify_says_it_leaves_pythonpath_out_and_how_to_keep_it(tmp_path):
    told = run_verify_command(tmp_path, env={"PYTHONPATH": str(tmp_path / "mine")})
    assert "PYTHONPATH" in told.stderr and "--keep-pythonpath" in told.stderr
    kept = run_verify_command(tmp_path / "kept", "--keep-pythonpath", env={"PYTHONPATH": str(tmp_path / "mine")})
    assert "--keep-pythonpath" not in kept.stderr and kept.exit_code == told.exit_code
