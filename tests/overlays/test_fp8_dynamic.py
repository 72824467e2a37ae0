"""FP8 linears in ComfyUI's 2026 weight system (issue 21.2), against the fixtures of comfy_2026_ops.py.

Under DynamicVRAM the weights stay in host memory and ComfyUI's cast streams each one in per call; LoRA rides
`weight_lowvram_function`; fp8 checkpoints load as mixed-precision Linears holding QuantizedTensors. The FP8 path
must run there (FP8 GEMMs counted > 0) through ComfyUI's cast, keep no copy of any weight, keep LoRA's effect, use
a quantized layer's own codes and scale, and leave what it does not know stock, saying why. On CPU the FP8 GEMM is
emulated from the same codes (the fp8_calls fixture).
"""
from __future__ import annotations

import logging

import pytest
import torch

import blocks
import comfy_2026_ops as ops
import comfyui_fused_dit as node_pack
from fused_dit import families, registry, state
from fused_dit.integration import eras, fp8_linear_modules, fp8_modules, fp8_weights
from fused_dit.ops import fp8_linear as fl
from test_fp8_codes import LifecyclePatcher

MAKERS = {"flux": blocks.make_flux_stack, "wan": blocks.make_wan_stack}
ERA = "tests/overlays/comfy_2026_ops.py"


@pytest.fixture(autouse=True)
def _fixture_ops_are_a_verified_era():
    """The fixture ops' forwards count as one more verified era of the FP8 Linear seam, as a maintainer records a
    real release (variants.json)."""
    for label, cls in ((ERA, ops.Linear), (f"{ERA}:MixedLinear", ops.MixedLinear)):
        state.add_verified(eras.LINEAR_VARIANT, label, {eras.LINEAR_FORWARD: eras.fingerprint_of(cls.forward)[0]})
    eras.clear_caches()
    ops.CASTS.clear()
    ops.UNCASTS.clear()
    yield
    eras.clear_caches()


def _model(name, mixed=frozenset()):
    model, inputs = MAKERS[name](dtype=torch.bfloat16, comfy_state="newer")
    return ops.to_comfy_ops(model, mixed), inputs


def _node(patcher):
    (patched,) = node_pack.FusedDiTOps().patch(patcher, norm_rope=False, adaln=False, gate=False, fp8_linear=True)
    return patched


def _error(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _no_cached_codes(model) -> bool:
    return not any(fp8_modules._CACHE_ATTR in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_fp8_gemms_run_under_dynamic_vram_on_weights_comfys_cast_streams_in(name, fp8_calls):
    model, inputs = _model(name)
    base = ops.DynamicPatcher(model)
    stock = base.sample(inputs)
    assert ops.CASTS and all(streamed for _, streamed in ops.CASTS)       # stock streams every weight too
    ops.CASTS.clear()
    ops.UNCASTS.clear()
    patched = _node(base)
    assert not patched.object_patches                                     # no codes in the weights' place
    out = patched.sample(inputs)
    linears = fp8_linear_modules(model)
    assert len(fp8_calls) == len(linears) > 0                             # every FP8 Linear ran an FP8 GEMM
    assert len(ops.CASTS) == len(ops.UNCASTS) >= len(linears)             # each through ComfyUI's cast + uncast
    assert _error(out, stock) <= 0.1
    assert _no_cached_codes(model)                                        # no second copy of any weight kept


def test_replace_under_dynamic_vram_swaps_nothing_and_says_why(fp8_calls, caplog):
    model, inputs = _model("flux")
    state.forget_said()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        patched = _node(ops.DynamicPatcher(model))
        patched.sample(inputs)                                            # the lines come at the first call
    assert not patched.object_patches and not patched.wrappers.get("prepare_sampling")
    assert "DynamicVRAM" in caplog.text


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_lora_on_streamed_weights_changes_the_fp8_output_by_the_loras_effect(name, fp8_calls):
    model, inputs = _model(name)
    base = ops.DynamicPatcher(model)
    lora = base.clone()
    deltas = {}
    for layer, module in fp8_linear_modules(model):
        weight = module.weight.detach().float()
        deltas[f"diffusion_model.{layer}.weight"] = 0.5 * weight.abs().mean() * torch.randn(weight.shape)
    lora.add_patches(deltas)
    stock, lora_stock = base.sample(inputs), lora.sample(inputs)
    plain_fp8, lora_fp8 = _node(base).sample(inputs), _node(lora).sample(inputs)
    assert fp8_calls
    effect, fp8_effect = lora_stock.float() - stock.float(), lora_fp8.float() - plain_fp8.float()
    assert float(effect.norm()) > 0.05 * float(stock.float().norm())     # the LoRA matters
    assert _error(lora_fp8, lora_stock) < _error(lora_fp8, stock)        # never silently dropped
    assert float((fp8_effect - effect).norm() / effect.norm()) <= 0.25   # the LoRA's own effect, in FP8


def test_a_lora_weight_function_under_the_legacy_patcher_goes_through_the_cast(fp8_calls):
    # the legacy ModelPatcher's low-VRAM LoRA: weight_function on a module whose weight is in place
    layer = ops.to_comfy_ops(torch.nn.Sequential(torch.nn.Linear(64, 32)).bfloat16())[0]
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    delta = 0.05 * torch.randn(32, 64)
    with torch.inference_mode():
        plain = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
        layer.weight_function = [lambda w: w + delta.to(w.dtype)]
        lora = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
        expected = torch.nn.functional.linear(x.float(), layer.weight.float() + delta, layer.bias.float())
    assert len(fp8_calls) == 2 and ops.CASTS
    assert _error(lora, expected) < _error(plain, expected)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "legacy"])
def test_comfys_fp8_layers_run_their_own_codes_and_scale(dynamic, fp8_calls, monkeypatch):
    model, inputs = _model("flux")
    names = [name for name, m in model.named_modules() if type(m) is ops.Linear and "mod" not in name]
    model = ops.to_comfy_ops(blocks.make_flux_stack(dtype=torch.bfloat16, comfy_state="newer")[0], set(names))
    mixed = [m for m in model.modules() if isinstance(m, ops.MixedLinear)]
    assert mixed
    quantised = []
    real = fl.quantize_weight_fp8
    monkeypatch.setattr(fl, "quantize_weight_fp8", lambda w: quantised.append(w) or real(w))
    patcher = ops.DynamicPatcher(model) if dynamic else LifecyclePatcher(model)   # legacy: weights in place
    stock = patcher.sample(inputs)
    out = _node(patcher).sample(inputs)
    assert len(fp8_calls) >= len(mixed) > 0
    assert not quantised                                                 # their codes, never re-quantised
    assert _error(out, stock) <= 0.1


def test_a_quantized_layer_gives_the_gemm_exactly_its_codes_and_scale(fp8_calls):
    layer = ops.MixedLinear(torch.nn.Linear(64, 48).bfloat16())
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        out = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
    qt = layer._parameters["weight"]
    expected = fl.linear_fp8(x, fl.Fp8Weight(qt._qdata, qt._params.scale, False, None, ()), layer.bias)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("layout, flag", [("TensorCoreNVFP4Layout", None), ("TensorCoreFP8E4M3Layout", "_full_precision_mm"),
                                          ("TensorCoreFP8E4M3Layout", "pre_quant_scale")])
def test_what_the_fp8_path_does_not_read_stays_stock_and_says_why(layout, flag, fp8_calls, caplog):
    layer = ops.MixedLinear(torch.nn.Linear(64, 48).bfloat16(), layout)
    if flag:
        setattr(layer, flag, True)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="fused_dit"), torch.inference_mode():
        out = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
        stock = layer(x)
    assert not fp8_calls and torch.equal(out, stock)
    assert "stock forward (cast seam)" in caplog.text
    assert fp8_weights.static_decline(layer, x) is not None


def test_the_plan_sees_a_lora_attached_by_a_later_load(fp8_calls):
    layer = ops.to_comfy_ops(torch.nn.Sequential(torch.nn.Linear(64, 32)).bfloat16())[0]
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        fp8_modules.fp8_linear_forward(layer, x, layer.forward)          # in place: the cached-codes path
        assert not ops.CASTS
        layer.weight_lowvram_function = lambda w: w + 1.0                # a DynamicVRAM load with a LoRA
        fp8_modules.fp8_linear_forward(layer, x, layer.forward)
    assert ops.CASTS                                                     # through the cast: LoRA applied


def test_the_node_says_once_how_fp8_holds_weights_under_dynamic_vram_and_where_it_was_measured(monkeypatch, caplog):
    """On a GPU the FP8 forward could run on, DynamicVRAM keeps the bf16 weights: no_extra_memory becomes
    per_call_codes, and the node says so once, citing the results that compare it with codes_beside_weights and
    --disable-dynamic-vram (never the figures themselves)."""
    monkeypatch.setattr(registry, "runs_on", lambda device, needs: None)
    model, inputs = _model(sorted(MAKERS)[0])
    state.forget_said()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        first = _node(ops.DynamicPatcher(model))
        for patched in (first, _node(ops.DynamicPatcher(model))):
            patched.sample(inputs)                                        # said at the first call, once
    assert not first.object_patches
    lines = [r.getMessage() for r in caplog.records if "--disable-dynamic-vram" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("Fused DiT Ops: fp8_weights: per_call_codes (")
    assert families.PER_CALL_EVIDENCE.cite() in lines[0] and "codes_beside_weights" in lines[0]


def _resident_patcher(model):
    patcher = ops.DynamicPatcher(model)
    patcher.resident = True
    return patcher


def _kept(model) -> int:
    return sum(fp8_weights.RESIDENT_CODES_ATTR in m.__dict__ for m in model.modules())


def _counting_quantiser(monkeypatch):
    """Every weight quantisation of the FP8 path, kept (per tensor or row-wise) or for one call (per_call_weight:
    its codes are made in the activation's launch)."""
    quantised = []
    for name in ("quantize_weight_fp8", "quantize_weight_fp8_rows", "per_call_weight"):
        real = getattr(fl, name)
        monkeypatch.setattr(fl, name, lambda w, real=real: quantised.append(w) or real(w))
    return quantised


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_alongside_keeps_the_codes_of_resident_weights_between_calls(name, fp8_calls, monkeypatch):
    model, inputs = _model(name)
    patcher = _resident_patcher(model)
    stock = patcher.sample(inputs)
    quantised = _counting_quantiser(monkeypatch)
    (alongside,) = node_pack.FusedDiTOps().patch(patcher, False, False, False, True, fp8_weights="alongside")
    outputs = [alongside.sample(inputs) for _ in range(3)]
    linears = len(fp8_linear_modules(model))
    assert len(fp8_calls) == 3 * linears > 0                               # FP8 GEMMs on every call
    assert len(quantised) == linears                                       # quantised once, not per call
    assert _kept(model) == linears
    assert all(torch.equal(out, outputs[0]) for out in outputs)
    assert _error(outputs[0], stock) <= 0.1
    replace = _node(patcher).sample(inputs)                                 # per-call codes: the same bits
    assert torch.equal(replace, outputs[0])


def test_replace_under_dynamic_vram_quantises_per_call_and_keeps_nothing(fp8_calls, monkeypatch):
    model, inputs = _model("flux")
    patcher = _resident_patcher(model)
    patcher.sample(inputs)
    quantised = _counting_quantiser(monkeypatch)
    replace = _node(patcher)
    replace.sample(inputs)
    replace.sample(inputs)
    assert len(quantised) == 2 * len(fp8_linear_modules(model)) and not _kept(model)


def test_streamed_weights_and_loras_keep_no_codes(fp8_calls, monkeypatch):
    model, inputs = _model("flux")
    streamed = ops.DynamicPatcher(model)                                    # not resident: a new tensor per call
    (alongside,) = node_pack.FusedDiTOps().patch(streamed, False, False, False, True, fp8_weights="alongside")
    alongside.sample(inputs)
    assert fp8_calls and not _kept(model)
    resident = _resident_patcher(model)
    (kept,) = node_pack.FusedDiTOps().patch(resident, False, False, False, True, fp8_weights="alongside")
    plain = kept.sample(inputs)
    assert _kept(model)
    lora = resident.clone()
    lora.add_patches({f"diffusion_model.{layer}.weight": 0.5 * m.weight.detach().float().abs().mean()
                      * torch.randn(m.weight.shape) for layer, m in fp8_linear_modules(model)})
    for module in model.modules():                                          # ComfyUI faults the LoRA'd weights in anew
        module.__dict__.pop("_v_weight", None)
    (lora_kept,) = node_pack.FusedDiTOps().patch(lora, False, False, False, True, fp8_weights="alongside")
    lora_out = lora_kept.sample(inputs)
    assert not _kept(model)                                                 # a module with a LoRA drops its codes
    assert _error(lora_out, plain) > 0.05                                   # and the LoRA is applied


def test_cleanup_drops_the_kept_codes(fp8_calls):
    model, inputs = _model("wan")
    patcher = _resident_patcher(model)
    (alongside,) = node_pack.FusedDiTOps().patch(patcher, False, False, False, True, fp8_weights="alongside")
    alongside.sample(inputs)
    assert _kept(model)
    [cleanup] = alongside.callbacks["on_cleanup"][node_pack.WRAPPER_KEY]
    cleanup(alongside)
    assert not _kept(model)
