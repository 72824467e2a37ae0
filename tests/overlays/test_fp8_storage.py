"""FP8 linears with the bf16 weights kept in host memory (`enable(..., fp8_weights="replace")`), on a GPU.

Needs an sm_89+ CUDA device (the FP8 forward declines elsewhere, so nothing is stored; test_blocks.py checks that
on CPU). Checks: the GPU gives back the weights' bytes, the output is the same bits as with the weights alongside,
a declined call still runs the stock forward, and `disable` puts every weight back, bit for bit, on its device.
"""
from __future__ import annotations

import pytest
import torch

import blocks
import fused_dit
from fused_dit.testing import byte_mismatch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="FP8 linears need an sm_89+ CUDA device")

ALL_OPS = ("norm_rope", "adaln", "gate", "fp8_linear")


def _stack(seed):
    model, inputs = blocks.make_flux_stack(hidden=256, heads=4, depth=1, depth_single=1, img_len=64, txt_len=16,
                                           dtype=torch.bfloat16, device="cuda", seed=seed % 1000)
    return model, inputs


def _call(model, inputs):
    with torch.inference_mode():
        return model(**{k: v.clone() for k, v in inputs.items()})


def test_replace_frees_the_weights_and_keeps_the_output_bits(seed):
    model, inputs = _stack(seed)
    originals = {name: p.detach().clone() for name, p in model.named_parameters()}
    fused_dit.enable(model, ops=ALL_OPS)
    alongside = _call(model, inputs)
    fused_dit.disable(model, drop_fp8_weights=True)

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    report = fused_dit.enable(model, ops=ALL_OPS, fp8_weights="replace")
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    stored = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.device.type == "cpu"]
    assert report["fp8_weights_stored_in_host_memory"] == report["fp8_linears"] == len(stored) > 0
    bf16_bytes = sum(m.weight.numel() * 2 for m in stored)
    assert report["gpu_bytes_freed"] == bf16_bytes
    # the bf16 weights (2 bytes per parameter) left and their codes (1 byte) came, with a scale or two per module
    assert before - after >= bf16_bytes - bf16_bytes // 2 - 2048 * len(stored)
    assert byte_mismatch(_call(model, inputs), alongside)[0] == 0

    fused_dit.disable(model)
    for name, p in model.named_parameters():
        assert p.device.type == "cuda", name
        assert byte_mismatch(p.detach(), originals[name])[0] == 0, name
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_declined_call_brings_a_stored_weight_for_the_call_only(seed):
    model, _ = _stack(seed)
    linear = model.double_blocks[0].img_attn.proj
    original = linear.weight.detach().clone()
    fused_dit.enable(model, ops=("fp8_linear",), fp8_weights="replace")
    try:
        assert linear.weight.device.type == "cpu"
        # grad enabled and the weight requires grad (as ComfyUI 0.3.64 leaves it): autograd records the call, so
        # the FP8 forward declines and the stock forward runs
        assert linear.weight.requires_grad and torch.is_grad_enabled()
        x = torch.randn(3, linear.in_features, device="cuda", dtype=torch.bfloat16)
        got = linear(x)
        assert got.requires_grad
        expected = torch.nn.functional.linear(x, original, linear.bias.detach())
        assert byte_mismatch(got.detach(), expected)[0] == 0
        assert linear.weight.device.type == "cpu"
    finally:
        fused_dit.disable(model)
    assert linear.weight.device.type == "cuda"
