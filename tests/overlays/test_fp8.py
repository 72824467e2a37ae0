"""FP8 overlay ops (5-7): quantisation codes, the FP8 linear and the fused GELU quantisation.

On CPU the kernels run under TRITON_INTERPRET=1 (conftest). The interpreter's own fp32 -> e4m3 cast deviates from
torch's in a few percent of codes (measured ~3%: round-ups are lost, mostly where the value
should round up to a power of two, and in the subnormal range), so the kernels' math is checked exactly
through `out_fp32=True` (the value the kernel would cast, cast here by torch) and the interpreter's direct fp8
output is held to a bound. Byte-exact codes on the GPU: benchmarks/gpu_fp8_gates.py.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from fused_dit import dispatch
from fused_dit.integration import fp8_modules as fm
from fused_dit.ops import fp8_linear as fl
from fused_dit.ops import gelu_quantize_fp8 as gq
from fused_dit.ops import quantize_fp8 as qf
from fused_dit.testing import byte_mismatch

E4M3 = torch.float8_e4m3fn
INTERPRETER_FP8_CAST_BOUND = 0.05   # fraction of codes the interpreter's fp8 cast may get wrong (one code off)
# tests that hand CPU tensors to the kernel launchers: they run where the interpreter does (no CUDA device); on a
# GPU benchmarks/gpu_fp8_gates.py holds the compiled kernels to byte-exact codes
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="CPU tensors through the Triton interpreter (GPU: gpu_fp8_gates.py)")


def codes_of(values_fp32: torch.Tensor) -> torch.Tensor:
    return values_fp32.to(E4M3)


def activations(seed: int, shape=(3, 700), outliers=True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    if outliers:
        x.view(-1)[::97] *= 400          # beyond +-448 for the unit-scale clamp
    return x


def test_dynamic_reference_is_absmax_over_448():
    x = torch.tensor([[0.5, -896.0], [3.0, 0.0]])
    codes, scale = qf.quantize_fp8_dynamic_reference(x)
    assert scale.item() == 2.0
    assert codes.float().tolist() == [[0.25, -448.0], [1.5, 0.0]]


def test_dynamic_reference_of_zero_tensor_is_zero_codes():
    codes, scale = qf.quantize_fp8_dynamic_reference(torch.zeros(8))
    assert scale.item() > 0 and not codes.float().any()


@interpreter_only
def test_dynamic_kernel_math_is_exact(seed):
    x = activations(seed)
    values, scale = qf.quantize_dynamic_triton(x, out_fp32=True)
    ref_codes, ref_scale = qf.quantize_fp8_dynamic_reference(x)
    assert scale.item() == ref_scale.item()
    assert byte_mismatch(codes_of(values), ref_codes) == (0, 0.0)


@interpreter_only
def test_dynamic_kernel_fp8_output_within_interpreter_cast_bound(seed):
    x = activations(seed)
    codes, _ = qf.quantize_dynamic_triton(x)
    ref_codes, _ = qf.quantize_fp8_dynamic_reference(x)
    assert codes.dtype == E4M3 and codes.shape == x.shape
    _, fraction = byte_mismatch(codes, ref_codes)
    if torch.device(x.device).type == "cpu":
        assert fraction <= INTERPRETER_FP8_CAST_BOUND
        # the interpreter's cast loses round-ups (mostly the carry into the next binade, and in the subnormal
        # range): a wrong code is always smaller in magnitude than the right one
        wrong = codes.view(torch.uint8) != ref_codes.view(torch.uint8)
        assert bool((codes[wrong].float().abs() < ref_codes[wrong].float().abs()).all())
    else:
        assert fraction == 0.0


@interpreter_only
def test_comfy_unit_scale_clamps_input_in_place_like_comfyui(seed):
    x = activations(seed)
    ours, theirs = x.clone(), x.clone()
    values = qf.quantize_comfy_triton(ours, None, clamp_input_in_place=True, out_fp32=True)
    ref_codes = qf.quantize_fp8_comfy_reference(theirs, None, clamp_input_in_place=True)
    assert byte_mismatch(codes_of(values), ref_codes) == (0, 0.0)
    assert torch.equal(ours, theirs)                  # the side effect ComfyUI's callers can observe
    assert ours.abs().max().item() == 448.0 and x.abs().max().item() > 448.0


@interpreter_only
def test_comfy_unit_scale_without_write_back_leaves_input_alone(seed):
    x = activations(seed)
    before = x.clone()
    qf.quantize_comfy_triton(x, None, clamp_input_in_place=False, out_fp32=True)
    assert torch.equal(x, before)


@interpreter_only
def test_comfy_static_scale_multiplies_by_rounded_reciprocal(seed):
    x = activations(seed, outliers=False)
    scale_input = torch.tensor(0.37)
    values = qf.quantize_comfy_triton(x, scale_input, out_fp32=True)
    ref_codes = qf.quantize_fp8_comfy_reference(x, scale_input)
    assert byte_mismatch(codes_of(values), ref_codes) == (0, 0.0)


def test_public_quantizers_fall_back_to_references_on_cpu(caplog):
    x = activations(1)
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        dispatch._said.clear()
        codes, scale = qf.quantize_fp8_dynamic(x)
    ref_codes, ref_scale = qf.quantize_fp8_dynamic_reference(x)
    assert torch.equal(codes.view(torch.uint8), ref_codes.view(torch.uint8)) and scale == ref_scale
    assert any("quantize_fp8_dynamic -> eager" in r.getMessage() for r in caplog.records)


@interpreter_only
def test_gelu_quantize_kernel_math_matches_eager_chain_in_fp32(seed):
    h = activations(seed, outliers=False)
    values, scale = gq.gelu_quantize_dynamic_triton(h, out_fp32=True)
    _, ref_scale = gq.gelu_quantize_fp8_dynamic_reference(h)
    gelu = torch.nn.functional.gelu(h, approximate="tanh")
    # the interpreter's tanh comes from exp (no libdevice): compare the pre-cast values in fp32
    assert scale.item() == pytest.approx(ref_scale.item(), rel=1e-6)
    expected = (gelu / ref_scale).clamp(-448, 448)
    # atol is in the scaled domain (full scale 448): exp-based tanh vs tanhf near gelu(h) = 0
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-4)
    _, fraction = byte_mismatch(codes_of(values), codes_of(expected))
    assert fraction <= 0.01


@interpreter_only
def test_gelu_quantize_comfy_unit_scale(seed):
    h = activations(seed, outliers=False) * 100
    values = gq.gelu_quantize_comfy_triton(h, None, out_fp32=True)
    expected = torch.nn.functional.gelu(h, approximate="tanh").clamp(-448, 448)
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-4)


def test_linear_fp8_emulation_is_close_to_bf16_linear(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 64, generator=g).bfloat16()
    weight = (torch.randn(48, 64, generator=g) / 8).bfloat16()
    bias = torch.randn(48, generator=g).bfloat16()
    codes, w_scale = fl.quantize_weight_fp8(weight)
    fp8 = fl.Fp8Weight(codes, w_scale, static_input=False, input_scale=None, source_key=())
    out = fl.linear_fp8(x, fp8, bias)
    ref = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    assert out.shape == (2, 5, 48) and out.dtype == torch.bfloat16
    error = (out.float() - ref).norm() / ref.norm()
    assert error <= 0.05


def test_linear_fp8_comfy_module_uses_its_own_codes_and_clamps_input():
    module = torch.nn.Linear(32, 16, bias=False)
    with torch.no_grad():
        module.weight.data = (torch.randn(16, 32) / 4).to(E4M3)
    module.scale_weight = torch.tensor(0.5)
    module.scale_input = None
    fp8 = fm.fp8_weight_of(module)
    assert fp8.static_input and fp8.codes.data_ptr() == module.weight.data_ptr()
    x = torch.randn(4, 32).bfloat16()
    x[0, 0] = 1000.0
    out = fl.linear_fp8(x, fp8)
    assert x[0, 0].item() == 448.0                        # ComfyUI's in-place clamp, reproduced
    ref = x.to(E4M3).float() @ (module.weight.float() * 0.5).t()
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


def test_fp8_weight_cache_follows_weight_changes():
    module = torch.nn.Linear(32, 16).bfloat16()
    first = fm.fp8_weight_of(module)
    assert fm.fp8_weight_of(module) is first
    with torch.no_grad():
        module.weight.mul_(2)                             # in-place edit bumps the version counter
    second = fm.fp8_weight_of(module)
    assert second is not first and second.scale.item() == pytest.approx(2 * first.scale.item())
    fm.drop_fp8_cache(module)
    assert fm._CACHE_ATTR not in module.__dict__


@pytest.mark.parametrize("setup, expected", [
    (lambda m: setattr(m, "weight_function", [lambda w: w]), "weight_function/bias_function"),
    (lambda m: setattr(m, "bias_function", [lambda b: b]), "weight_function/bias_function"),
    (lambda m: m.requires_grad_(True), "autograd records this call"),
])
def test_fp8_forward_declines_and_runs_stock_forward(setup, expected, caplog):
    module = torch.nn.Linear(32, 16).bfloat16().requires_grad_(False)
    setup(module)
    x = torch.randn(3, 32).bfloat16()
    dispatch._said.clear()
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        out = fm.fp8_linear_forward(module, x, module.forward)
    assert torch.equal(out, torch.nn.Linear.forward(module, x))
    assert expected in fm.decline_reason(module, x)
    assert any("fp8_linear -> stock forward" in r.getMessage() for r in caplog.records)


def test_fp8_forward_on_cpu_declines_with_capability_reason():
    module = torch.nn.Linear(32, 16).bfloat16()
    with torch.inference_mode():
        reason = fm.decline_reason(module, torch.randn(2, 32).bfloat16())
    assert reason and ("CPU" in reason or "interpreter" in reason)


def test_fp8_forward_declines_shapes_not_divisible_by_16():
    module = torch.nn.Linear(30, 16).bfloat16()
    with torch.inference_mode():
        assert "divisible by 16" in fm.decline_reason(module, torch.randn(2, 30).bfloat16())


def test_ffn_forward_without_fp8_matches_stock():
    ffn = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(64, 32))
    ffn = ffn.bfloat16()
    assert fm.is_gelu_tanh_ffn(ffn)
    x = torch.randn(2, 3, 32).bfloat16()
    assert torch.equal(fm.ffn_forward_fp8(ffn, x, ffn.forward), ffn(x))


@interpreter_only
def test_dynamic_kernels_reduce_partial_maxima_across_many_programs():
    # small chunks and few programs, so the interpreter runs the multi-program, multi-iteration grid the GPU runs
    launch = replace(qf.LAUNCH, elements_per_iteration=64, max_programs=4)
    x = activations(3, shape=(1000, 13))
    x.view(-1)[-1] = 5000.0                                 # the maximum sits in the very last chunk
    assert qf.launch_grid(x.numel(), launch) == (4, 51)
    values, scale = qf.quantize_dynamic_triton(x, out_fp32=True, launch=launch)
    ref_codes, ref_scale = qf.quantize_fp8_dynamic_reference(x)
    assert scale.item() == ref_scale.item()
    assert byte_mismatch(codes_of(values), ref_codes) == (0, 0.0)
    h = x / 100
    _, gelu_scale = gq.gelu_quantize_dynamic_triton(h, out_fp32=True, launch=launch)
    assert gelu_scale.item() == pytest.approx(gq.gelu_quantize_fp8_dynamic_reference(h)[1].item(), rel=1e-6)


def test_fp8_plan_is_rebuilt_when_the_module_changes():
    module = torch.nn.Linear(32, 16).bfloat16().requires_grad_(False)
    x = torch.randn(3, 32).bfloat16()
    first = fm.fp8_plan_of(module, x)
    assert fm.fp8_plan_of(module, x) is first               # nothing changed: the cached plan
    module.weight_function = [lambda w: w]
    declined = fm.fp8_plan_of(module, x)
    assert declined is not first and "weight_function" in declined.decline_reason
    module.weight_function = []
    with torch.no_grad():
        module.weight.mul_(2)
    assert fm.fp8_plan_of(module, x).key != first.key
    fm.drop_fp8_cache(module)
    assert fm._PLAN_ATTR not in module.__dict__
