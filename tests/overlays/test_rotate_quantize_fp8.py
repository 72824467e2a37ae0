"""The Hadamard-rotating FP8 quantiser for cuDNN's FP8 SDPA (ops/rotate_quantize_fp8.py), on CPU.

Pinned here: the Triton pass (under TRITON_INTERPRET=1 on CPU, compiled on an FP8 GPU; tiny shapes with partial tiles, strided inputs and more
tiles than programs) writes the same e4m3 bytes and the same fp32 scales as its eager reference, for both head dims,
both dtypes, rotation and V's mean on and off; the rotation is the normalised Hadamard matrix (orthogonal, so
Q K^T is unchanged in fp32); K's smoothing subtracts exactly its token mean and leaves softmax unchanged; the codes
encode the rotated, smoothed values within e4m3's rounding; off an FP8 GPU the public entry point gives the
reference; and both kernels build for sm_89 and sm_90 without a GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fused_dit.ops import rotate_quantize_fp8 as rq
from fused_dit.testing import byte_mismatch

OVERLAYS = Path(rq.__file__).resolve().parents[2]
# tiles of 8 rows and at most 3 programs per tensor: partial tiles, several tiles per program, the grid's tail
SMALL = rq.RotateQuantizeLaunch(block_s=8, num_warps=1, max_programs=3)
needs_fp8 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                               reason="the kernels' e4m3 conversion needs sm_89 or later")


def operands(seed: int, d: int, dtype=torch.bfloat16, sq: int = 19, skv: int = 13, strided: bool = False,
             device: str = "cpu"):
    """q, k, v `[2, 3, S, D]` with DiT-like outlier channels in q and k and an offset on k's and v's channels;
    `strided`: views of `[B, S, H, D]` tensors, as ComfyUI's attention hands them over."""
    g = torch.Generator().manual_seed(seed)
    gain = torch.ones(d)
    gain[torch.randperm(d, generator=g)[:3]] = 12.0

    def make(s, offset):
        x = torch.randn(2, s, 3, d, generator=g) * gain + offset * torch.randn(d, generator=g)
        x = x.to(device=device, dtype=dtype)
        return x.transpose(1, 2) if strided else x.transpose(1, 2).contiguous()
    return make(sq, 0.0), make(skv, 2.0), make(skv, 1.5)


@needs_fp8
@pytest.mark.parametrize("d", rq.HEAD_DIMS)
@pytest.mark.parametrize("rotate, v_mean", [(True, False), (True, True), (False, True)])
def test_codes_and_scales_equal_the_reference_byte_for_byte(seed, device, d, rotate, v_mean):
    """Under the interpreter (CPU) and compiled on an FP8 GPU alike."""
    q, k, v = operands(seed, d, strided=True, device=device)
    out = rq.rotate_quantize_triton(q, k, v, rotate, v_mean, launch=SMALL)
    ref = rq.rotate_quantize_reference(q, k, v, rotate, v_mean)
    for name in ("q", "k", "v"):
        codes, expected = getattr(out, name), getattr(ref, name)
        assert codes.dtype == torch.float8_e4m3fn and codes.is_contiguous() and codes.shape == expected.shape
        assert byte_mismatch(codes, expected)[0] == 0, name
        assert torch.equal(getattr(out, f"{name}_scale"), getattr(ref, f"{name}_scale")), name
        assert getattr(out, f"{name}_scale").shape == (1, 1, 1, 1)
    assert (out.v_mean is None) == (not v_mean)
    if v_mean:
        assert torch.equal(out.v_mean, ref.v_mean)


@needs_fp8
def test_half_precision_inputs_and_one_program_per_tensor(seed, device):
    q, k, v = operands(seed, 64, torch.float16, sq=8, skv=8, device=device)
    out = rq.rotate_quantize_triton(q, k, v, launch=rq.RotateQuantizeLaunch(block_s=8, num_warps=1))
    ref = rq.rotate_quantize_reference(q, k, v)
    assert all(byte_mismatch(a, b)[0] == 0 for a, b in zip(out[:3], ref[:3]))
    assert all(torch.equal(a, b) for a, b in zip(out[3:6], ref[3:6]))


@pytest.mark.parametrize("d", rq.HEAD_DIMS)
def test_the_rotation_is_the_normalised_hadamard_matrix_and_keeps_q_kt(seed, d):
    h = rq.hadamard(d)
    assert torch.equal(h, h.T) and torch.allclose(h @ h.T, torch.eye(d, dtype=h.dtype), atol=1e-12)
    q, k, _ = operands(seed, d)
    qf, kf = q.float(), k.float() - rq.token_mean(k)
    rot_q, rot_k = rq.rotate_reference(qf), rq.prepared_reference(k, rq.token_mean(k), rotate=True)
    assert torch.allclose(rot_q.double(), qf.double() @ h, rtol=0, atol=1e-5 * float(qf.abs().max()))
    logits, rotated = qf.double() @ kf.double().transpose(-1, -2), rot_q @ rot_k.transpose(-1, -2)
    # fp32 rounding of the butterfly and of the product, relative to the logits' scale
    assert float((rotated.double() - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
    # the outlier channels are spread: the rotated tensor's largest value is well below the input's
    assert float(rot_q.abs().max()) < float(qf.abs().max()) / 2


def test_smoothing_subtracts_the_token_mean_and_leaves_softmax_unchanged(seed):
    q, k, _ = operands(seed, 64)
    mean = rq.token_mean(k)
    assert mean.dtype == torch.float32 and mean.shape == (2, 3, 1, 64)
    assert torch.equal(rq.prepared_reference(k, mean, rotate=False), k.float() - mean)
    smoothed = rq.prepared_reference(k, mean, rotate=True)
    assert float(smoothed.double().mean(dim=2).abs().max()) <= 1e-5 * float(smoothed.abs().max())
    qd, kd = q.double(), k.double()
    scale = 64 ** -0.5
    exact = torch.softmax(qd @ kd.transpose(-1, -2) * scale, dim=-1)
    shifted = torch.softmax(qd @ (kd - mean.double()).transpose(-1, -2) * scale, dim=-1)
    assert torch.allclose(shifted, exact, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rotate", [True, False])
def test_the_codes_encode_the_rotated_smoothed_values_within_e4m3_rounding(seed, rotate):
    q, k, v = operands(seed, 128)
    out = rq.rotate_quantize_reference(q, k, v, rotate, v_mean=True)
    for codes, scale, x in ((out.q, out.q_scale, rq.prepared_reference(q, None, rotate)),
                            (out.k, out.k_scale, rq.prepared_reference(k, rq.token_mean(k), rotate)),
                            (out.v, out.v_scale, rq.prepared_reference(v, out.v_mean, False))):
        assert float(codes.float().abs().max()) == rq.E4M3_MAX      # the scale is amax / 448
        back = codes.float() * scale
        # e4m3: relative error at most 2^-4 for normal codes, half the subnormal spacing (2^-10 codes) below
        assert float(((back - x).abs() - x.abs() * 2 ** -4).max()) <= float(scale) * 2 ** -10


def test_off_an_fp8_gpu_the_entry_point_gives_the_reference(seed):
    q, k, v = operands(seed, 64)
    out, ref = rq.rotate_quantize(q, k, v, v_mean=True), rq.rotate_quantize_reference(q, k, v, v_mean=True)
    assert all(byte_mismatch(a, b)[0] == 0 for a, b in zip(out[:3], ref[:3]))
    assert all(torch.equal(a, b) for a, b in zip(out[3:], ref[3:]))


def test_refusals_name_their_cause():
    x = torch.zeros(1, 2, 8, 64)
    assert "head dim 96" in rq.refusal(torch.zeros(1, 2, 8, 96), x, x)
    assert "unlike q" in rq.refusal(x, torch.zeros(1, 3, 8, 64), torch.zeros(1, 3, 8, 64))
    assert rq.refusal(x, x, x) is None


COMPILE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from fused_dit.ops import rotate_quantize_fp8
print(json.dumps(rotate_quantize_fp8.compile_report()))
"""


def report_without_interpreter() -> dict:
    """rotate_quantize_fp8.compile_report() in a fresh interpreter without TRITON_INTERPRET (kernels decorated
    under the interpreter do not compile); FP fusion on, as Triton's default has it."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", COMPILE, str(OVERLAYS)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_both_kernels_build_for_sm89_and_sm90_without_a_gpu():
    """Triton compiles both kernels for a GPU it does not have (GPUTarget + ASTSource, ptxas included), at both
    head dims: the codes pass converts with the hardware e4m3 instruction and divides with IEEE division, neither
    pass uses atomics, and no multiply-add is contracted into an FMA (the codes equal the reference's)."""
    found = report_without_interpreter()
    if "skip" in found:
        pytest.skip(found["skip"])
    for arch, target in (("89", "sm_89"), ("90", "sm_90a")):
        for d in rq.HEAD_DIMS:
            stats, codes = found[f"{arch}/{d}/stats"], found[f"{arch}/{d}/codes"]
            for built in (stats, codes):
                assert built["target"] == target and built["cubin_bytes"] > 0
                assert not built["atomics"] and not built["fma"]
            assert codes["e4m3"] and codes["div_rn"]
