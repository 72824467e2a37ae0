"""`python -m benchmarks attention-kernels`: its CPU smoke path (a tiny shape under TRITON_INTERPRET=1) writes every
section a GPU run writes, records what it cannot run as an error instead of stopping, and records what the time
budget leaves out as skipped; the committed compile check reads as the command writes it."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import attention_kernels

REPO = Path(__file__).resolve().parent.parent


def _smoke(tmp_path, *extra) -> dict:
    out = tmp_path / "smoke.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "benchmarks", "attention-kernels", "--smoke", "--out", str(out),
                           *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_smoke_run_writes_every_section_and_records_what_it_cannot_run(tmp_path):
    report = _smoke(tmp_path)
    shape = report["shapes"]["smoke"]
    assert shape["speed"]["fp8_default"]["launch"] == report["fp8_default_launch"]
    # the kernel on SageAttention 2's recipe: its own launch, timed, and its error on both input kinds
    assert shape["speed"]["fp8_sage2"]["launch"] == report["fp8_sage2_launch"] != report["fp8_default_launch"]
    assert "ms" in shape["speed"]["fp8_sage2"] and "v-channel" in report["fp8_sage2_launch"]
    for kind in ("gaussian", "dit_like"):
        errors = shape[f"error_{kind}"]
        assert set(errors) == {"fp8", "fp8_sage2", "cudnn_fp8", "cudnn_fp8_rotated", "cudnn_fp8_rotated_v_mean", "sage",
                               "sage_smooth_k", "sdpa_bf16", "sage2", "fa4"}
        assert {"relative_frobenius", "cosine", "max_abs"} <= set(errors["fp8_sage2"])
        for row in ("cudnn_fp8", "cudnn_fp8_rotated", "cudnn_fp8_rotated_v_mean"):
            assert "error" in errors[row]            # no cuDNN FP8 SDPA on the CPU: recorded, not raised
        for row in ("sage2", "fa4"):                 # a package (or GPU) that is not here: skipped, with the reason
            assert set(errors[row]) == {"skipped"}, errors[row]
        assert {"relative_frobenius", "cosine", "max_abs"} <= set(errors["fp8"])
        if report["sageattention"].startswith("not importable"):
            assert "error" in errors["sage"]
    for row, package in (("sage2", "sageattention"), ("fa4", "flash_attn")):
        assert set(shape["speed"][row]) == {"skipped"}
        if importlib.util.find_spec(package) is None:
            assert "not importable" in shape["speed"][row]["skipped"]
    assert report["fp8_default_launch"] in shape["fp8_sweep"] and len(shape["fp8_sweep"]) > 1
    assert shape["fp8_best"]["launch"] in shape["fp8_sweep"]
    assert report["peaks_tflops"] == {"bf16_dense": attention_kernels.H200_BF16_DENSE_TFLOPS,
                                      "fp8_dense": attention_kernels.H200_FP8_DENSE_TFLOPS}


def test_past_the_time_budget_measurements_are_recorded_as_skipped(tmp_path):
    report = _smoke(tmp_path, "--budget-s", "0")
    shape = report["shapes"]["smoke"]
    assert all("skipped" in entry for entry in shape["speed"].values())
    assert all("skipped" in entry for entry in shape["fp8_sweep"].values()) and shape["fp8_best"] is None


def test_no_sweep_runs_the_first_pass_alone(tmp_path):
    shape = _smoke(tmp_path, "--no-sweep")["shapes"]["smoke"]
    assert "fp8_sweep" not in shape and "fp8_best" not in shape
    assert {"fp8_default", "fp8_sage2", "sage2", "fa4"} <= set(shape["speed"]) and "sage2" in shape["error_dit_like"]
    assert "fp8_sage2" in shape["error_dit_like"] and "fp8_sage2" in shape["error_gaussian"]


def test_the_flop_count_and_the_best_launch():
    assert attention_kernels.flops((1, 24, 4608, 4608, 128)) == 4 * 24 * 4608 * 4608 * 128
    sweep = {"a": {"tflops": 1.0}, "b": {"error": "x"}, "c": {"tflops": 2.0}}
    assert attention_kernels.best_of(sweep) == {"launch": "c", "tflops": 2.0}


def test_the_committed_compile_check_builds_both_gpus_default_launch():
    report = json.loads((REPO / "benchmarks" / "results" / "attention-fp8-compile.json").read_text())
    defaults = {b["arch"]: b for b in report["builds"] if b["default"]}
    assert set(defaults) == {"sm_89", "sm_90"}
    for arch, build in defaults.items():
        assert "error" not in build and build["attention_fp8"]["mma"], build


def test_the_fp8_attention_generation_configs_ask_the_node_for_its_fp8_mode():
    from benchmarks import generation_configs as configs
    toggles = {name: ("BOOLEAN", {"default": False}) for name in ("norm_rope", "adaln", "gate", "fp8_linear")}
    node = {"required": {"model": ("MODEL",), **toggles},
            "optional": {"attention": ("BOOLEAN", {"default": True}), "fp8_weights": (["replace"], {}),
                         "attention_mode": (["exact", "fp8"], {"default": "exact"})}}
    offered = configs.node_families(node)
    alone, _ = configs.node_inputs("overlay_attention_fp8", offered, node)
    assert alone == {"norm_rope": False, "adaln": False, "gate": False, "fp8_linear": False, "attention": True,
                     "attention_mode": "fp8"}
    everything, _ = configs.node_inputs("overlay_all_fp8_attn", offered, node)
    assert everything == {**{name: True for name in offered}, "fp8_weights": "replace", "attention_mode": "fp8"}
    assert "attention_mode" not in configs.node_inputs("overlay_all_fp8", offered, node)[0]
    older = {**node, "optional": {k: v for k, v in node["optional"].items() if k != "attention_mode"}}
    with pytest.raises(configs.ConfigSkipped, match="attention_mode"):
        configs.node_inputs("overlay_attention_fp8", offered, older)
