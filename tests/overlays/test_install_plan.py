"""The install plan: `enable` works out what to install on a model once and uses it again while the model holds.

ComfyUI's node enables and disables around every model call; before the plan, every call recognised the blocks,
matched fingerprints, read signatures and walked every block's Linears again (tens of milliseconds of host time
per sampling step, measured on the CPU with a full-depth Flux fixture). These tests pin that the work is done once,
and that everything it depends on still makes a new plan: a module replaced, a class forward changed, a verified
era added or removed.
"""
from __future__ import annotations

import logging

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack
import era_blocks
import fused_dit
from comfy_fakes import FakeModelPatcher, call_model
from fused_dit import integration, registry, state
from fused_dit.integration import eras

OPS = ("norm_rope", "adaln", "gate", "fp8_linear")


@pytest.fixture
def count_recognitions(monkeypatch):
    calls = []
    original = integration._recognised_blocks

    def counting(model, skipped):
        calls.append(model)
        return original(model, skipped)
    monkeypatch.setattr(integration, "_recognised_blocks", counting)
    return calls


def _overlaid(model) -> set[int]:
    return {id(m) for m in model.modules() if integration.OVERLAY_MARK in m.__dict__}


def test_enable_recognises_the_model_once_across_calls(count_recognitions):
    model, inputs = blocks.make_flux_stack(depth=2, depth_single=2)
    reports = []
    for _ in range(4):
        reports.append(fused_dit.enable(model, ops=OPS))
        installed = _overlaid(model)
        fused_dit.disable(model)
        assert not _overlaid(model)
    assert len(count_recognitions) == 1
    assert installed and all(r == reports[0] for r in reports)
    assert reports[0]["blocks"] == 4 and reports[0]["fp8_linears"] > 0


def test_the_planned_forwards_give_the_same_output_as_a_fresh_plan():
    model, inputs = blocks.make_flux_stack()
    stock = blocks.run(model, inputs)
    outputs = []
    for _ in range(2):
        fused_dit.enable(model, ops=("norm_rope", "adaln", "gate"))
        try:
            outputs.append(blocks.run(model, inputs))
        finally:
            fused_dit.disable(model)
    assert torch.equal(outputs[0], outputs[1])
    assert (outputs[0] - stock).abs().max() <= 1e-5 * stock.abs().max()
    assert torch.equal(blocks.run(model, inputs), stock)


def test_a_replaced_submodule_makes_a_new_plan_that_covers_it(count_recognitions):
    model, _ = blocks.make_flux_stack(depth=1, depth_single=1)
    fused_dit.enable(model, ops=("fp8_linear",))
    fused_dit.disable(model)
    block = model.double_blocks[0]
    old = block.img_mlp[0]
    new = torch.nn.Linear(old.in_features, old.out_features)
    block.img_mlp[0] = new                        # as an object patch swaps a module in
    fused_dit.enable(model, ops=("fp8_linear",))
    try:
        assert len(count_recognitions) == 2
        assert integration.OVERLAY_MARK in block.img_mlp.__dict__ or integration.OVERLAY_MARK in new.__dict__
        assert integration.OVERLAY_MARK not in old.__dict__
    finally:
        fused_dit.disable(model)
    assert not _overlaid(model)


def test_a_changed_class_forward_makes_a_new_plan(count_recognitions, monkeypatch):
    model, _ = blocks.make_flux_stack(depth=1, depth_single=1)
    fused_dit.enable(model, ops=("adaln",))
    fused_dit.disable(model)
    stock = type(model.single_blocks[0]).forward

    def patched_by_another_node(self, *args, **kwargs):
        return stock(self, *args, **kwargs)
    monkeypatch.setattr(type(model.single_blocks[0]), "forward", patched_by_another_node)
    report = fused_dit.enable(model, ops=("adaln",))
    fused_dit.disable(model)
    assert len(count_recognitions) == 2
    assert any("overrides" in line or "differs" in line or "SingleStreamBlock" in line for line in report["skipped"])


def test_adding_or_removing_a_verified_era_makes_a_new_plan(count_recognitions):
    model, _ = era_blocks.make_flux("torch_norm")
    first = fused_dit.enable(model, ops=("adaln",))
    fused_dit.disable(model)
    assert first["blocks"] == 0                  # torch-norm fixture: no verified era yet
    integration.add_verified_model(model, "plan test era")
    try:
        second = fused_dit.enable(model, ops=("adaln",))
        fused_dit.disable(model)
        assert second["blocks"] > 0 and len(count_recognitions) == 2
    finally:
        for name in state.all_variants():
            state.remove_verified(name, "plan test era")
        eras.clear_caches()
    third = fused_dit.enable(model, ops=("adaln",))
    fused_dit.disable(model)
    assert third["blocks"] == 0 and len(count_recognitions) == 3


def test_disable_without_a_plan_still_restores_everything():
    model, _ = blocks.make_wan_stack()
    fused_dit.enable(model, ops=OPS)
    model.__dict__.pop(integration._ENABLED_ATTR)       # e.g. a model enabled by another copy of the package
    fused_dit.disable(model)
    assert not _overlaid(model)


def test_node_installs_nothing_around_the_calls_when_every_family_stays_stock(caplog, monkeypatch):
    """Whether a block runs its verified code is read at the model's first call; where none does, that call and
    every later one go straight to ComfyUI's model, no install and restore around them."""
    model, inputs = era_blocks.make_flux("2026")       # 2026 blocks: no block-forward variant matches
    state.forget_said()
    enables = []
    monkeypatch.setattr(registry, "_enable", lambda *a, **kw: enables.append(a))
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), False, True, True, False)
        assert "passes its model calls straight through" not in caplog.text
        for _ in range(2):
            call_model(patched, **inputs)
    assert "passes its model calls straight through" in caplog.text
    assert not enables and not integration.is_active(model, ("adaln", "gate"))


def test_node_keeps_its_wrapper_for_an_op_seam_alone(monkeypatch):
    """2026 blocks stay stock, but the RoPE seam (verified for the fixture here, switched on) still needs the
    per-call install."""
    monkeypatch.setenv("FUSED_DIT_SEAMS", "rope_ck_seam")
    model, _ = era_blocks.make_flux("2026")
    assert integration.is_active(model, ("norm_rope",))
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), True, False, False, False)
    assert patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]


def test_node_adds_its_wrapper_where_a_family_runs():
    model, _ = blocks.make_flux_stack()
    assert integration.is_active(model, ("adaln",))
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), False, True, False, False)
    assert patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]


def test_dropping_fp8_weights_forgets_the_plans_and_the_modules_they_hold(count_recognitions):
    """ComfyUI's cleanup (the node's ON_CLEANUP: disable with drop_fp8_weights) leaves no plan holding a module, so
    FP8 codes Linears a clone swapped in and ComfyUI took out again are not kept alive by a plan."""
    import gc
    import weakref

    model, _ = blocks.make_flux_stack(depth=1, depth_single=1)
    block = model.double_blocks[0]
    swapped_in = torch.nn.Linear(block.img_mlp[0].in_features, block.img_mlp[0].out_features)
    original, block.img_mlp[0] = block.img_mlp[0], swapped_in       # an object patch while the clone is loaded
    fused_dit.enable(model, ops=("fp8_linear",))
    fused_dit.disable(model)
    block.img_mlp[0] = original                                      # ComfyUI unloads the clone
    watched = weakref.ref(swapped_in)
    del swapped_in
    fused_dit.disable(model, drop_fp8_weights=True)
    gc.collect()
    assert watched() is None and integration._PLAN_ATTR not in model.__dict__
    fused_dit.enable(model, ops=("fp8_linear",))                    # a new plan for the model as it is now
    fused_dit.disable(model)
    assert len(count_recognitions) == 2
