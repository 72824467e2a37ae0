"""benchmarks/attention_projection.py: measured attention kernels projected onto another GPU's published peaks."""
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks import attention_projection as ap

REPO = Path(__file__).resolve().parents[1]


def gpu(bf16, int8=None, fp8=None):
    return types.SimpleNamespace(bf16_tflops=bf16, int8_tops=int8, fp8_tflops=fp8)


def test_an_exact_kernel_keeps_its_fraction_of_the_bf16_peak():
    assert ap.projected_ms("sdpa_CUDNN_ATTENTION", 1e12, 10.0, gpu(1000), gpu(250)) == pytest.approx(40.0)


def test_an_int8_qk_kernel_is_two_halves_at_one_efficiency():
    same = ap.projected_ms("fp8_default", 1e12, 10.0, gpu(1000, 2000), gpu(1000, 2000))
    assert same == pytest.approx(10.0)
    # the target's INT8 rate four times its bf16 rate (an RTX 4090) against two times (an H200): the INT8 half
    # shrinks more, the bf16 half scales with the bf16 peak
    faster_int8 = ap.projected_ms("fp8_default", 1e12, 10.0, gpu(1000, 2000), gpu(1000, 4000))
    assert faster_int8 == pytest.approx(10.0 * (1 / 4000 + 1 / 1000) / (1 / 2000 + 1 / 1000))
    assert ap.projected_ms("fp8_default", 1e12, 10.0, gpu(1000, 2000), gpu(1000)) is None   # no INT8 peak
    assert ap.projected_ms("cudnn_fp8", 1e12, 10.0, gpu(1000, fp8=2000), gpu(100)) is None  # no FP8 peak


@pytest.mark.parametrize("kernel", ["fp8_sage2", "sage2"])
def test_sageattention_2s_formats_are_an_int8_and_an_fp8_half(kernel):
    """INT8 Q K^T and e4m3 P V (SageAttention 2, the pack's kernel on its recipe): the P V half scales with the FP8
    peak, not the bf16 one."""
    assert ap.projected_ms(kernel, 1e12, 10.0, gpu(1000, 2000, 2000), gpu(1000, 2000, 2000)) == pytest.approx(10.0)
    projected = ap.projected_ms(kernel, 1e12, 10.0, gpu(1000, 2000, 2000), gpu(100, 400, 200))
    assert projected == pytest.approx(10.0 * (1 / 400 + 1 / 200) / (1 / 2000 + 1 / 2000))
    assert ap.projected_ms(kernel, 1e12, 10.0, gpu(1000, 2000, 2000), gpu(100, 400)) is None   # no FP8 peak


def test_the_rotated_cudnn_fp8_path_scales_with_the_fp8_peak_and_fa4_with_bf16():
    assert ap.projected_ms("cudnn_fp8_rotated", 1e12, 10.0, gpu(1000, fp8=2000), gpu(100, fp8=500)) == \
        pytest.approx(40.0)
    assert ap.projected_ms("fa4", 1e12, 10.0, gpu(1000), gpu(250)) == pytest.approx(40.0)


def test_a_projection_compares_each_kernel_with_projected_cudnn_exact():
    measured = {"shapes": {"s": {"b_h_lq_lkv_d": [1, 1, 8, 8, 8], "flops": 4e12,
                                 "speed": {"sdpa_CUDNN_ATTENTION": {"ms": 10.0}, "sdpa_FLASH_ATTENTION": {"ms": 20.0},
                                           "fp8_quantize_kv": {"ms": 1.0}, "skipped": "budget"},
                                 "error_dit_like": {"fp8": {"relative_frobenius": 0.04}}}}}
    shapes = ap.project(measured, gpu(1000), gpu(500))
    kernels = shapes["s"]["kernels"]
    assert set(kernels) == {"sdpa_CUDNN_ATTENTION", "sdpa_FLASH_ATTENTION"}      # no peak model: left out
    assert kernels["sdpa_FLASH_ATTENTION"]["vs_cudnn_exact"] == 0.5
    assert kernels["sdpa_CUDNN_ATTENTION"]["projected_ms"] == 20.0
    assert shapes["s"]["error_dit_like"] == {"fp8": 0.04}


def test_the_command_marks_its_output_a_projection_and_refuses_an_unknown_gpu(tmp_path):
    source = tmp_path / "measured.json"
    source.write_text(json.dumps({"shapes": {}}))
    out = tmp_path / "p.json"
    run = [sys.executable, "-m", "benchmarks", "attention-projection", "--from", str(source), "--out", str(out)]
    done = subprocess.run(run + ["--gpu", "rtx-4090"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["projection"] is True and "NVIDIA GeForce RTX 4090" in report["what"]
    refused = subprocess.run(run + ["--gpu", "rtx-9999"], cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2 and "rtx-9999" in refused.stderr
