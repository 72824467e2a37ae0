"""Block-level A/B: the fixtures' stock forwards (ComfyUI's math) against the same blocks with overlays enabled.

Small fp32 shapes on CPU (kernels through TRITON_INTERPRET=1). fp32 gate: 1e-5 relative to the output's scale.
FP8 linears decline on CPU (logged), so with `fp8_linear` enabled the result must still match stock.
"""
from __future__ import annotations

import copy

import pytest
import torch

import blocks
import fused_dit

ALL_OPS = ("norm_rope", "adaln", "gate", "fp8_linear")
MAKERS = {"flux": blocks.make_flux_stack, "wan": blocks.make_wan_stack}


def relative_error(actual, expected):
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize("family", ["norm_rope", "adaln", "gate", ALL_OPS], ids=str)
@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_overlays_match_stock_block_math_in_fp32(model_name, family, seed):
    model, inputs = MAKERS[model_name](seed=seed % 1000)
    stock = blocks.run(model, inputs)
    overlaid = blocks.run(model, inputs, ops=(family,) if isinstance(family, str) else family)
    assert relative_error(overlaid, stock) <= 1e-5


def test_flipped_flux_double_block_slices_rope_per_stream():
    model, inputs = blocks.make_flux_stack(depth_single=0)
    model.double_blocks[0].flipped_img_txt = True
    stock = blocks.run(model, inputs)
    assert relative_error(blocks.run(model, inputs, ops=("norm_rope",)), stock) <= 1e-5


def test_batch_of_two_keeps_samples_apart():
    model, inputs = blocks.make_wan_stack(batch=2)
    both = blocks.run(model, inputs, ops=ALL_OPS)
    first = blocks.run(model, {k: (v[:1] if k != "freqs" else v) for k, v in inputs.items()}, ops=ALL_OPS)
    assert relative_error(both[:1], first) <= 1e-5


def test_disable_restores_stock_forwards_exactly():
    model, _ = blocks.make_flux_stack()
    before = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    report = fused_dit.enable(model, ops=ALL_OPS)
    assert report["blocks"] == 2 and report["fp8_linears"] > 0
    assert "forward" in model.double_blocks[0].__dict__
    restored = fused_dit.disable(model)
    assert restored == 2 + report["fp8_linears"] - 2   # each FFN counts two linears, one forward
    assert {name: m.__dict__.get("forward") for name, m in model.named_modules()} == before


def test_enable_twice_installs_once():
    model, inputs = blocks.make_wan_stack()
    fused_dit.enable(model, ops=("adaln",))
    fused_dit.enable(model, ops=("adaln",))
    assert fused_dit.disable(model) == 1


def test_unsupported_model_is_refused_with_its_class_name():
    with pytest.raises(fused_dit.UnsupportedModelError, match="Sequential"):
        fused_dit.enable(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_unknown_op_family_is_refused():
    model, _ = blocks.make_wan_stack()
    with pytest.raises(ValueError, match="unknown op families"):
        fused_dit.enable(model, ops=("flash",))


def test_unknown_fp8_weight_storage_is_refused_before_anything_changes():
    model, _ = blocks.make_flux_stack()
    with pytest.raises(ValueError, match="fp8_weights='moved'; expected one of no_extra_memory, codes_beside_weights"):
        fused_dit.enable(model, ops=ALL_OPS, fp8_weights="moved")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_replace_storage_leaves_weights_where_fp8_cannot_run():
    # CPU weights: the FP8 forward declines for them, so nothing is quantised or moved (GPU: test_fp8_storage.py)
    model, inputs = blocks.make_flux_stack()
    weights = {name: p.clone() for name, p in model.named_parameters()}
    stock = blocks.run(model, inputs)
    report = fused_dit.enable(model, ops=ALL_OPS, fp8_weights="replace")
    assert report["fp8_weights_stored_in_host_memory"] == 0 and report["gpu_bytes_freed"] == 0
    fused_dit.disable(model)
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())
    assert relative_error(blocks.run(model, inputs, ops=ALL_OPS), stock) <= 1e-5


def test_block_with_changed_signature_is_left_stock():
    class DoubleStreamBlock(blocks.DoubleStreamBlock):
        def forward(self, img, txt, vec, pe, extra=None):   # a future ComfyUI signature
            return super().forward(img, txt, vec, pe)

    block = DoubleStreamBlock(64, 4)
    report = fused_dit.enable(block, ops=("adaln",))
    assert report["blocks"] == 0 and "the overlay was written for" in report["skipped"][0]
    assert "forward" not in block.__dict__


@pytest.mark.parametrize("model_name", ["flux", "wan"])
def test_a_deep_copy_of_a_model_that_had_the_overlays_runs_its_own_modules(model_name):
    # the overlay forward of the last enable is kept for the next one; deepcopy brought it along, still naming the
    # original's modules, so the copy ran the fp32 original's Linears on its bf16 inputs (validate_real_blocks.py)
    make = blocks.make_flux_stack if model_name == "flux" else blocks.make_wan_stack
    model, inputs = make()
    fused_dit.enable(model, ops=fused_dit.OP_FAMILIES)
    fused_dit.disable(model)
    twin = copy.deepcopy(model).to(torch.bfloat16)
    twin_inputs = {k: v if k in ("pe", "freqs") else v.to(torch.bfloat16) for k, v in inputs.items()}
    stock = blocks.run(twin, twin_inputs)
    # on CPU every FP8 Linear declines, so the stock forwards of the copy's own modules must run
    assert torch.equal(blocks.run(twin, twin_inputs, ops=("fp8_linear",)), stock)
