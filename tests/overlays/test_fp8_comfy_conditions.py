"""FP8 linears in the conditions ComfyUI creates (issue 13.1): the model in training mode as ComfyUI 0.3.64 leaves
Flux and Wan (parameters requiring grad), or `.eval().requires_grad_(False)` as newer releases do, sampled under
torch.inference_mode() as ComfyUI's executor runs every prompt.

The FP8 forward may decline only where autograd records the call. On CPU the FP8 kernels cannot run, so the
CPU tests let dispatch accept the fp8_linear op and count the calls of the FP8 path, which emulates the GEMM from
the same codes (fused_dit.ops.fp8_linear.linear_fp8; the `fp8_calls` fixture, conftest.py); on an sm_89+ GPU the
real torch._scaled_mm calls are counted.
"""
from __future__ import annotations

import pytest
import torch

import blocks
import fused_dit
from fused_dit.integration import fp8_modules as fm

MAKERS = {"flux": blocks.make_flux_stack, "wan": blocks.make_wan_stack}


def _forward(model, inputs, context):
    with context():
        return model(**{k: v.clone() for k, v in inputs.items()})


def _relative_error(actual, expected) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm())


@pytest.mark.parametrize("comfy_state", blocks.COMFY_STATES)
@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_fp8_runs_in_every_state_comfyui_leaves_a_model_in(model_name, comfy_state, fp8_calls):
    model, inputs = MAKERS[model_name](dtype=torch.bfloat16, comfy_state=comfy_state)
    assert model.training == (comfy_state == "0.3.64")
    stock = _forward(model, inputs, torch.inference_mode)
    report = fused_dit.enable(model, ops=("fp8_linear",))
    try:
        out = _forward(model, inputs, torch.inference_mode)
    finally:
        fused_dit.disable(model)
    # one FP8 call per Linear (an FFN's second Linear is its fused GELU call)
    assert len(fp8_calls) == report["fp8_linears"] > 0
    assert _relative_error(out, stock) <= 0.1


@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_fp8_runs_on_weights_loaded_under_inference_mode(model_name, fp8_calls):
    # ComfyUI loads and moves the weights inside torch.inference_mode(): they are inference tensors, which keep no
    # version counter (reading it raised "Inference tensors do not track version counter" in every real run)
    with torch.inference_mode():
        model, inputs = MAKERS[model_name](dtype=torch.bfloat16, comfy_state="0.3.64")
    assert all(p.is_inference() for p in model.parameters())
    stock = _forward(model, inputs, torch.inference_mode)
    report = fused_dit.enable(model, ops=("fp8_linear",))
    try:
        out = _forward(model, inputs, torch.inference_mode)
        calls = len(fp8_calls)
        again = _forward(model, inputs, torch.inference_mode)   # the codes are reused within one enable
    finally:
        fused_dit.disable(model)
    assert calls == report["fp8_linears"] > 0 and len(fp8_calls) == 2 * calls
    assert torch.equal(out, again) and _relative_error(out, stock) <= 0.1


def test_an_inference_weight_edited_in_place_gets_new_codes_at_the_next_enable(fp8_calls):
    # ModelPatcher patches LoRA weights in place (copy_) before sampling; an inference tensor cannot say so
    with torch.inference_mode():
        module = torch.nn.Linear(32, 16).bfloat16()
        x = torch.randn(3, 32).bfloat16()
        fm.new_enable_epoch()
        first = fm.fp8_linear_forward(module, x, module.forward)
        module.weight.copy_(module.weight * 2)
        fm.new_enable_epoch()
        second = fm.fp8_linear_forward(module, x, module.forward)
    assert not torch.equal(first, second)


def test_training_mode_is_not_a_reason_to_decline(fp8_calls):
    # the rule before issue 13.1 declined here ("module in training mode"), so FP8 never ran in ComfyUI 0.3.64
    module = torch.nn.Linear(32, 16).bfloat16().train()
    x = torch.randn(3, 32).bfloat16()
    with torch.inference_mode():
        assert fm.decline_reason(module, x) is None
        fm.fp8_linear_forward(module, x, module.forward)
    assert fp8_calls == ["linear"]


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_fp8_runs_without_grad_mode_even_where_weights_require_grad(context, fp8_calls):
    model, inputs = blocks.make_flux_stack(dtype=torch.bfloat16, comfy_state="0.3.64")
    assert all(p.requires_grad for p in model.parameters())
    report = fused_dit.enable(model, ops=("fp8_linear",))
    try:
        _forward(model, inputs, context)
    finally:
        fused_dit.disable(model)
    assert len(fp8_calls) == report["fp8_linears"]


def test_fp8_declines_where_autograd_records_the_call(fp8_calls):
    model, inputs = blocks.make_wan_stack(dtype=torch.bfloat16, comfy_state="0.3.64")
    stock = _forward(model, inputs, torch.enable_grad)
    fused_dit.enable(model, ops=("fp8_linear",))
    try:
        out = _forward(model, inputs, torch.enable_grad)
    finally:
        fused_dit.disable(model)
    assert fp8_calls == [] and out.requires_grad
    assert torch.equal(out.detach(), stock.detach())


def test_fp8_runs_with_grad_mode_on_where_nothing_requires_grad(fp8_calls):
    # newer ComfyUI: requires_grad_(False) on the diffusion model, so even outside inference mode nothing records
    model, inputs = blocks.make_wan_stack(dtype=torch.bfloat16, comfy_state="newer")
    report = fused_dit.enable(model, ops=("fp8_linear",))
    try:
        _forward(model, inputs, torch.enable_grad)
    finally:
        fused_dit.disable(model)
    assert len(fp8_calls) == report["fp8_linears"]


def test_an_input_requiring_grad_declines(fp8_calls):
    module = torch.nn.Linear(32, 16).bfloat16().requires_grad_(False)
    x = torch.randn(3, 32).bfloat16().requires_grad_(True)
    assert fm.decline_reason(module, x) == fm.AUTOGRAD_REASON
    with torch.no_grad():
        assert fm.decline_reason(module, x) is None


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="real FP8 GEMMs need an sm_89+ CUDA device")
@pytest.mark.parametrize("comfy_state", blocks.COMFY_STATES)
@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_scaled_mm_runs_on_the_gpu_in_every_state(model_name, comfy_state, monkeypatch):
    counted = []
    real_scaled_mm = torch._scaled_mm

    def scaled_mm(*args, **kwargs):
        counted.append(1)
        return real_scaled_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    model, inputs = MAKERS[model_name](hidden=256, heads=4, img_len=64, txt_len=16, dtype=torch.bfloat16,
                                       device="cuda", comfy_state=comfy_state) if model_name == "flux" else \
        MAKERS[model_name](dim=256, heads=4, ffn_dim=512, length=64, dtype=torch.bfloat16, device="cuda",
                           comfy_state=comfy_state)
    stock = _forward(model, inputs, torch.inference_mode)
    report = fused_dit.enable(model, ops=fused_dit.OP_FAMILIES)
    try:
        out = _forward(model, inputs, torch.inference_mode)
    finally:
        fused_dit.disable(model, drop_fp8_weights=True)
    assert len(counted) == report["fp8_linears"] > 0
    assert _relative_error(out, stock) <= 0.1
