"""Versioned overlays: recognition by fingerprint, fallback with a reason, and ComfyUI's hooks kept (issue 20).

The regressions of issue 20 on ComfyUI-shaped fixtures of the 2026 eras (era_blocks.py): Flux's QK norm as torch
nn.RMSNorm crashed with AttributeError 'scale'; the copied 0.3.64 forwards dropped attn1_patch / attn1_output_patch
(NAG-style) and broke on Flux.2's modulation=False. Now those blocks' code matches no verified variant, so they
stay stock (bit for bit), say why once, and every hook fires; RoPE runs the overlay's kernel through the
comfy-kitchen seam (`comfy.quant_ops.ck`, here era_blocks.CK) inside ComfyUI's own forwards, restored exactly.
"""
from __future__ import annotations

import logging
import textwrap

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack
import era_blocks
import fused_dit
from comfy_fakes import FakeModelPatcher, call_model
from fused_dit import fingerprint, state, variants
from fused_dit.integration import add_verified_model, eras, flux as flux_overlay, recognition

ALL_OPS = ("norm_rope", "adaln", "gate", "fp8_linear")


def enabled_run(model, inputs, transformer_options, ops=ALL_OPS):
    fused_dit.enable(model, ops=ops)
    try:
        return era_blocks.run_with(model, inputs, transformer_options)
    finally:
        fused_dit.disable(model)


# ------------------------------------------------------------------ the failures of issue 20
def test_flux_with_torch_rmsnorm_qk_norms_runs_stock_bits_instead_of_crashing_on_scale():
    model, inputs = era_blocks.make_flux(era="torch_norm")
    stock = blocks.run(model, inputs)
    assert torch.equal(blocks.run(model, inputs, ops=ALL_OPS), stock)


@pytest.mark.parametrize("modulation", [True, False], ids=["flux", "flux2"])
def test_2026_flux_blocks_keep_attention_patches_with_the_overlays_on(modulation):
    model, inputs = era_blocks.make_flux(modulation=modulation)
    seen = []

    def attn1_patch(q, k, v, pe=None, attn_mask=None, extra_options=None):
        seen.append("attn1_patch")
        return {"q": q * 1.5}

    options = {"patches": {"attn1_patch": [attn1_patch]}}
    stock = era_blocks.run_with(model, inputs, options)
    assert seen == ["attn1_patch"] * 2
    assert torch.equal(enabled_run(model, inputs, options), stock)
    assert seen == ["attn1_patch"] * 4


@pytest.mark.parametrize("modulation", [True, False], ids=["flux", "flux2"])
def test_2026_flux_blocks_keep_nag_style_attention_output_patches(modulation):
    model, inputs = era_blocks.make_flux(modulation=modulation)
    options = {"patches": {"attn1_output_patch": [lambda attn, extra: attn * 0.5]}}
    plain = era_blocks.run_with(model, inputs, {})
    stock = era_blocks.run_with(model, inputs, options)
    assert not torch.equal(stock, plain)
    assert torch.equal(enabled_run(model, inputs, options), stock)


def test_wan_2026_block_keeps_its_self_attention_patch():
    model, inputs = era_blocks.make_wan()
    calls = []

    def attn1_patch(args):
        calls.append(sorted(args))
        return args["x"] * 2

    options = {"patches": {"attn1_patch": [attn1_patch]}}
    stock = era_blocks.run_with(model, inputs, options)
    assert torch.equal(enabled_run(model, inputs, options), stock)
    assert calls == [["k", "q", "transformer_options", "x"]] * 2


def test_the_comfy_kitchen_seam_the_model_calls_is_left_as_it_was():
    model, inputs = era_blocks.make_flux()
    before = dict(vars(era_blocks.CK))
    enabled_run(model, inputs, {})
    assert vars(era_blocks.CK) == before


# ------------------------------------------------------------------ recognition and its reasons
def test_a_block_whose_code_matches_no_verified_release_stays_stock_and_says_why(caplog):
    model, inputs = era_blocks.make_flux(depth=2)
    eras.clear_caches()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        report = fused_dit.enable(model, ops=("norm_rope", "adaln", "gate"))
        fused_dit.disable(model)
        fused_dit.enable(model, ops=("norm_rope", "adaln", "gate"))
        fused_dit.disable(model)
    assert report["blocks"] == 0
    assert len(report["skipped"]) == 3 and all("flux_block_forward_0.3" in s for s in report["skipped"])
    said = [r.getMessage() for r in caplog.records if "stays stock" in r.getMessage()]
    assert len(said) == 2       # once per block class, not once per block or per call
    assert all("differs from every release it was verified on" in line for line in said)
    assert any("DoubleStreamBlock.forward" in line for line in said)


def test_the_0_3_64_shaped_fixtures_run_their_verified_variant():
    model, _ = blocks.make_flux_stack()
    lines = recognition(model)
    assert "flux_block_forward_0.3 (verified on ComfyUI tests/overlays/blocks.py)" in lines["norm_rope"]
    assert "linear_fp8_seam (verified on ComfyUI tests/overlays/blocks.py)" in lines["fp8_linear"]


def test_the_node_says_once_per_family_what_runs_and_what_stays_stock(caplog, cudnn_first):
    model, inputs = era_blocks.make_flux()
    state.forget_said()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        for _ in range(2):
            (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), attention=True)
            call_model(patched, **inputs)           # the blocks are read at the model's first call
    records = [r for r in caplog.records if r.getMessage().startswith("Fused DiT Ops:")]
    lines = [r.getMessage() for r in records]
    # norm_rope, adaln, gate and attention (fp8_linear is off by default), each said once, at DEBUG
    assert len(lines) == 4 and {r.levelno for r in records} == {logging.DEBUG}
    assert all("stock (code differs from every release" in line for line in lines[:3])
    assert lines[3].startswith("Fused DiT Ops: attention: stock: the release's SDPA order puts CUDNN_ATTENTION first")
    # and one line at INFO for the model: what runs, what stays stock, a short reason each
    [summary] = [r.getMessage() for r in caplog.records
                 if r.levelno >= logging.INFO and r.getMessage().startswith("Fused DiT Ops")]
    assert summary.startswith("Fused DiT Ops on Flux: runs norm_rope (fused Triton kernels). Stock: adaln, gate (")
    assert summary.endswith("attention (CUDNN_ATTENTION is first in this release's SDPA order). Off: fp8_linear. "
                            "Details at DEBUG.")


def test_the_node_keeps_other_nodes_model_wrappers():
    model, _ = era_blocks.make_flux()
    patcher = FakeModelPatcher(model)
    patcher.add_wrapper_with_key("apply_model", "another_node", lambda executor, *a, **kw: executor(*a, **kw))
    (patched,) = node_pack.FusedDiTOps().patch(patcher)
    assert set(patched.wrappers["apply_model"]) == {"another_node", "fused_dit"}


def test_a_verified_era_with_torch_rmsnorm_runs_the_kernel_with_weight_and_torchs_eps(monkeypatch):
    model, inputs = era_blocks.make_flux(era="torch_norm")
    add_verified_model(model, "torch-norm fixture")
    calls = []
    from fused_dit.ops import rms_rope

    real = rms_rope.flux_rms_rope

    def counting(q, k, q_scale, k_scale, pe, eps=1e-6, **kw):
        calls.append(eps)
        return real(q, k, q_scale, k_scale, pe, eps=eps, **kw)

    monkeypatch.setattr(rms_rope, "flux_rms_rope", counting)
    try:
        stock = blocks.run(model, inputs)
        overlaid = blocks.run(model, inputs, ops=("norm_rope",))
    finally:
        for name in ("flux_block_forward_0.3", "linear_fp8_seam"):
            state.remove_verified(name, "torch-norm fixture")
        eras.clear_caches()
    assert calls == [torch.finfo(torch.float32).eps] * 3     # img, txt of the double block; the single block
    assert float((overlaid - stock).abs().max() / stock.abs().max()) <= 1e-5


def test_qk_norm_parameters_follow_each_rmsnorm_kind():
    torch_norm = torch.nn.RMSNorm(8)
    assert flux_overlay.qk_norm_parameters(torch_norm, torch.bfloat16) == (torch_norm.weight, 2 ** -7)
    torch_norm.eps = 1e-5
    assert flux_overlay.qk_norm_parameters(torch_norm, torch.bfloat16)[1] == 1e-5
    comfy_norm = blocks.RMSNorm(8)
    assert flux_overlay.qk_norm_parameters(comfy_norm, torch.float32) == (comfy_norm.scale, 1e-6)
    comfy_norm.weight_function = [lambda w: w]
    assert flux_overlay.qk_norm_parameters(comfy_norm, torch.float32) is None


# ------------------------------------------------------------------ the normaliser
MODULE = '''
class Block:
    """Doc."""

    def forward(self, x):  # a comment
        return x + 1
'''


def test_fingerprints_ignore_docstrings_comments_and_layout_but_not_code():
    base = fingerprint.of_definition(MODULE, "Block.forward")
    reformatted = MODULE.replace("# a comment", "").replace("return x + 1", "return (x\n                + 1)")
    assert fingerprint.of_definition(reformatted, "Block.forward") == base
    assert fingerprint.of_definition(MODULE.replace("x + 1", "x + 2"), "Block.forward") != base
    assert fingerprint.of_definition(MODULE, "Block") != base


def test_a_live_method_fingerprints_as_its_file_does(tmp_path, monkeypatch):
    (tmp_path / "era_module.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    import era_module
    assert fingerprint.of_object(era_module.Block.forward) == fingerprint.of_definition(MODULE, "Block.forward")


@pytest.mark.parametrize("source, reason", [
    ("apply_rope = None\n", "bound by Assign"),
    ("try:\n    f = g\nexcept ImportError:\n    def f():\n        pass\n", "bound by Assign, FunctionDef"),
    ("import os\n", "f is not defined"),
])
def test_names_not_bound_by_one_def_have_no_fingerprint(source, reason):
    with pytest.raises(fingerprint.Unresolved, match=reason):
        fingerprint.of_definition(source, "apply_rope" if "apply_rope" in source else "f")


def test_a_match_names_the_release_and_a_mismatch_the_differing_code():
    spec = variants.Variant("v", variants.BLOCK_FORWARD, ("gate",), ("a", "b"), {"1.0": {"a": "x", "b": "y"}})
    assert variants.match(spec, {"a": "x", "b": "y"}).verified_on == "1.0"
    assert variants.match(spec, {"a": "x"}).verified_on == "1.0"          # b not used by this model
    miss = variants.match(spec, {"a": "x", "b": "z"})
    assert not miss.matched and "closest 1.0, differing: b" in miss.reason
    assert "differing: a (a: no source to fingerprint)" in variants.match(spec, {"a": None}).reason
    twice = variants.Variant("v", variants.OP_SEAM, ("gate",), ("a",), {"1.0": {"a": "x"}, "2.0": {"a": "x"}})
    assert variants.match(twice, {"a": "x"}, prefer="2.0").verified_on == "2.0"


# ------------------------------------------------------------------ the comfy-kitchen RoPE seam
def test_the_rope_seam_runs_inside_comfys_own_forward_only_while_enabled():
    model, inputs = era_blocks.make_flux()
    stock_rope = dict(vars(era_blocks.CK))
    during = []

    def look(attn, extra):
        during.append(era_blocks.CK.apply_rope is not stock_rope["apply_rope"])
        return attn

    options = {"patches": {"attn1_output_patch": [look]}}
    stock = era_blocks.run_with(model, inputs, options)
    report = fused_dit.enable(model, ops=("norm_rope",))
    try:
        overlaid = era_blocks.run_with(model, inputs, options)
    finally:
        fused_dit.disable(model)
    assert report["seams"] == {"rope_ck_seam": "runs (verified on ComfyUI tests/overlays/era_blocks.py)"}
    assert during == [False, False, True, True]         # stock call, then the overlay's: seam in place
    assert vars(era_blocks.CK) == stock_rope            # restored to the very objects
    assert torch.equal(overlaid, stock)


def test_the_rope_seam_stays_out_where_the_functions_around_it_differ(caplog):
    model, inputs = era_blocks.make_flux()
    stock_rope = era_blocks.CK.apply_rope
    saved = dict(state.all_variants()["rope_ck_seam"].verified_on["tests/overlays/era_blocks.py"])
    state.remove_verified("rope_ck_seam", "tests/overlays/era_blocks.py")
    eras.clear_caches()
    try:
        with caplog.at_level(logging.DEBUG, logger="fused_dit"):
            report = fused_dit.enable(model, ops=("norm_rope",))
            left_stock = era_blocks.CK.apply_rope is stock_rope
            fused_dit.disable(model)
    finally:
        state.add_verified("rope_ck_seam", "tests/overlays/era_blocks.py", saved)
        eras.clear_caches()
    assert left_stock and report["seams"]["rope_ck_seam"].startswith("stock: code differs from every release")
    assert any("rope_ck_seam stays stock" in r.getMessage() for r in caplog.records)


def test_the_node_puts_the_seam_back_when_the_model_call_raises():
    model, inputs = era_blocks.make_flux()
    stock_rope = dict(vars(era_blocks.CK))
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), True, False, False, False)
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]

    class Executor:
        class_obj = type("BaseModel", (), {"diffusion_model": model})

        def __call__(self):
            assert era_blocks.CK.apply_rope is not stock_rope["apply_rope"]
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        wrapper(Executor())
    assert vars(era_blocks.CK) == stock_rope


@pytest.mark.parametrize("order", ["first out first", "last out first"])
def test_two_models_enabled_at_once_leave_the_seam_as_it_was(order):
    (one, _), (two, _) = era_blocks.make_flux(), era_blocks.make_flux(seed=1)
    stock_rope = dict(vars(era_blocks.CK))
    assert fused_dit.enable(one, ops=("norm_rope",))["seams"]["rope_ck_seam"].startswith("runs (verified")
    assert fused_dit.enable(two, ops=("norm_rope",))["seams"] == {"rope_ck_seam": "runs (installed for another "
                                                                                  "model)"}
    for model in ((one, two) if order == "first out first" else (two, one)):
        fused_dit.disable(model)
    assert vars(era_blocks.CK) == stock_rope


def test_comfys_training_path_bypasses_the_seam():
    model, inputs = era_blocks.make_flux()
    era_blocks.comfy.model_management.in_training = True
    try:
        stock = era_blocks.run_with(model, inputs, {})
        assert torch.equal(enabled_run(model, inputs, {}, ops=("norm_rope",)), stock)
    finally:
        era_blocks.comfy.model_management.in_training = False


def test_the_rope_seam_compiles_as_one_custom_op_in_comfys_own_forward():
    model, inputs = era_blocks.make_flux(depth_single=0)
    stock = era_blocks.run_with(model, inputs, {})
    torch._dynamo.reset()
    fused_dit.enable(model, ops=("norm_rope",))
    try:
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.inference_mode():
            out = compiled(**{k: v.clone() for k, v in inputs.items()}, transformer_options={})
    finally:
        fused_dit.disable(model)
        torch._dynamo.reset()
    torch.testing.assert_close(out, stock, rtol=1e-5, atol=1e-5)


def test_the_rope_seam_is_off_by_default_with_its_measured_reason(monkeypatch, caplog):
    monkeypatch.delenv("FUSED_DIT_SEAMS")
    model, inputs = era_blocks.make_flux()
    stock_rope = era_blocks.CK.apply_rope
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        report = fused_dit.enable(model, ops=("norm_rope",))
        left_stock = era_blocks.CK.apply_rope is stock_rope
        fused_dit.disable(model)
    assert left_stock
    assert report["seams"]["rope_ck_seam"].startswith("stock: off by default: exact (the eager chain's bits) but "
                                                      "slower than stock on the H200")
    assert "FUSED_DIT_SEAMS=rope_ck_seam turns it on" in recognition(model, ("norm_rope",))["norm_rope"]


@pytest.mark.parametrize("make", [lambda: era_blocks.make_flux(), lambda: era_blocks.make_flux(modulation=False),
                                  era_blocks.make_wan], ids=["flux", "flux2", "wan"])
def test_a_lora_comfy_bakes_into_the_weights_is_kept_with_the_node_on(make):
    model, inputs = make()
    plain = era_blocks.run_with(model, inputs, {})
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features > 64)
    with torch.no_grad():                    # ComfyUI's ModelPatcher adds the LoRA's delta in place before the call
        linear.weight += 0.05 * torch.ones_like(linear.weight)
    lora_stock = era_blocks.run_with(model, inputs, {})
    with_node = enabled_run(model, inputs, {}, ops=("norm_rope", "adaln", "gate"))
    assert not torch.equal(lora_stock, plain) and torch.equal(with_node, lora_stock)


def test_a_lora_on_the_fly_makes_the_fp8_seam_decline_that_linear(fp8_calls, caplog):
    model, inputs = era_blocks.make_flux()
    model = model.to(torch.bfloat16)          # FP8 GEMMs take bf16/fp16 activations
    inputs = {k: v if k == "pe" else v.to(torch.bfloat16) for k, v in inputs.items()}
    linear = model.double_blocks[0].img_attn.qkv
    linear.weight_function = [lambda w: w]   # ComfyUI's low-VRAM LoRA rides weight_function
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        enabled_run(model, inputs, {}, ops=("fp8_linear",))
    assert fp8_calls                          # the other Linears ran FP8
    assert any("weight_function/bias_function present" in r.getMessage() for r in caplog.records)


def test_an_unreadable_variants_file_leaves_every_family_stock_without_an_error(monkeypatch, tmp_path):
    broken = tmp_path / "variants.json"
    broken.write_text("{not json")
    monkeypatch.setattr(variants, "DATA", broken)
    kept = state.STATE.variants
    state.reload_variants()
    try:
        model, inputs = blocks.make_flux_stack()
        stock = blocks.run(model, inputs)
        report = fused_dit.enable(model, ops=ALL_OPS)
        fused_dit.disable(model)
        assert torch.equal(blocks.run(model, inputs, ops=ALL_OPS), stock)
    finally:
        state.STATE.variants, state.STATE.variants_problem = kept, None
        eras.clear_caches()
    assert report["blocks"] == 0 and report["fp8_linears"] == 0
    assert all("variants.json unreadable (JSONDecodeError" in line for line in report["skipped"])
