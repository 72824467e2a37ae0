"""The registry: the families declare what they need as data (families.py), one place picks (registry.py).

What is pinned here: the declarations agree with the code that implements them and with variants.json; the FP8
weight mechanism follows the policy, the VRAM mode and the load device; the earlier spellings of fp8_weights do what
their policy does; capture-safety is honoured where blocks are captured in CUDA graphs; every line is said once.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack
import fused_dit
from comfy_fakes import FakeModelPatcher
from fused_dit import families, registry, state
from fused_dit.integration import OP_FAMILIES, eras, flux, seams, wan
from fused_dit.ops import KERNEL_DTYPES
from fused_dit.ops.fp8_linear import SUPPORTED_ACTIVATION_DTYPES
from fused_dit.ops.quantize_fp8 import FP8_MIN_CAPABILITY

OVERLAYS = Path(__file__).resolve().parents[2] / "overlays"


def _dtype_names(dtypes) -> set[str]:
    return {str(d).removeprefix("torch.") for d in dtypes}


def test_every_variant_is_declared_by_the_families_it_serves_and_nothing_else():
    shipped = json.loads((OVERLAYS / "fused_dit" / "variants.json").read_text())["variants"]
    declared: dict[str, set[str]] = {}
    for family in families.FAMILIES.values():
        for impl in family.implementations:
            if impl.needs.verified_code:
                declared.setdefault(impl.needs.verified_code, set()).add(family.name)
    assert declared == {name: set(spec["families"]) for name, spec in shipped.items()}
    assert {flux.VARIANT, wan.VARIANT, seams.ROPE_VARIANT, eras.LINEAR_VARIANT} == set(declared)


def test_the_declared_needs_are_the_ones_the_kernels_check():
    for family in families.FAMILIES.values():
        for impl in family.implementations:
            assert impl.needs.vram_modes and set(impl.needs.vram_modes) <= set(families.VRAM_MODES)
            assert impl.needs.capture_note
            assert (OVERLAYS / "fused_dit" / impl.module).is_file(), impl.module
    fp8 = families.LINEAR_FP8_SEAM.needs
    assert fp8.min_capability == FP8_MIN_CAPABILITY
    assert set(fp8.dtypes) == _dtype_names(SUPPORTED_ACTIVATION_DTYPES)
    assert set(families.FLUX_BLOCK_FORWARD.needs.dtypes) == _dtype_names(KERNEL_DTYPES)
    assert [f for f in families.FAMILIES if f != "attention"] == list(OP_FAMILIES)
    legacy = {impl.name for f in families.FAMILIES.values() for impl in f.implementations if impl.legacy}
    assert legacy == {flux.VARIANT, wan.VARIANT}


def test_the_node_offers_each_familys_toggle_with_its_declared_default():
    inputs = node_pack.FusedDiTOps.INPUT_TYPES()
    toggles = {**inputs["required"], **inputs["optional"]}
    for name, family in families.FAMILIES.items():
        assert toggles[name] == ("BOOLEAN", {"default": family.node_default, "tooltip": family.tooltip})


def test_the_node_module_and_the_families_load_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[1]); "
            "import comfyui_fused_dit as node; print(sorted(node.FusedDiTOps.INPUT_TYPES()['required']))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(OVERLAYS)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "fp8_linear" in proc.stdout


@pytest.mark.parametrize("value, policy", [("no_extra_memory", "no_extra_memory"), ("replace", "no_extra_memory"),
                                           ("codes_beside_weights", "codes_beside_weights"),
                                           ("alongside", "codes_beside_weights")])
def test_fp8_weights_earlier_spellings_name_the_same_policy(value, policy):
    assert families.fp8_weight_policy(value) == policy


def test_an_unknown_fp8_weights_value_is_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match="expected one of no_extra_memory, codes_beside_weights, replace, alongside"):
        families.fp8_weight_policy("gpu")
    model, _ = blocks.make_flux_stack()
    with pytest.raises(ValueError, match="fp8_weights='gpu'"):
        fused_dit.enable(model, ops=("fp8_linear",), fp8_weights="gpu")


@pytest.mark.parametrize("spelling", ["no_extra_memory", "replace"])
def test_a_scripts_no_extra_memory_holds_the_weights_in_host_memory(spelling):
    model, _ = blocks.make_flux_stack(dtype=torch.bfloat16)
    report = fused_dit.enable(model, ops=("fp8_linear",), fp8_weights=spelling)
    fused_dit.disable(model)
    assert "fp8_weights_stored_in_host_memory" in report      # 0 on a CPU: nothing leaves a GPU there


class _Patcher(FakeModelPatcher):
    def __init__(self, model, dynamic=False, load_device="cpu"):
        super().__init__(model)
        self.load_device = torch.device(load_device)
        self.dynamic = dynamic

    def is_dynamic(self):
        return self.dynamic


@pytest.mark.parametrize("policy, dynamic, capable, mechanism", [
    ("no_extra_memory", False, True, families.CODES_IN_PLACE),
    ("no_extra_memory", True, True, families.PER_CALL_CODES),
    ("no_extra_memory", False, False, None),
    ("no_extra_memory", True, False, None),
    ("codes_beside_weights", False, True, families.CACHED_CODES),
    ("codes_beside_weights", True, True, families.RESIDENT_CODES),
    ("codes_beside_weights", False, False, families.CACHED_CODES),
])
def test_the_fp8_weight_mechanism_follows_policy_vram_mode_and_device(monkeypatch, policy, dynamic, capable,
                                                                       mechanism):
    if capable:
        monkeypatch.setattr(registry, "runs_on", lambda device, needs: None)
    model, _ = blocks.make_flux_stack()
    selection = registry.choose(_Patcher(model, dynamic), registry.Request(("fp8_linear",), policy))
    assert selection.fp8_weights == mechanism
    assert selection.keep_resident_codes == (policy == "codes_beside_weights")
    assert any(line.startswith("fp8_weights: ") for line in selection.lines)


def test_where_blocks_are_captured_in_cuda_graphs_only_capture_safe_implementations_run(flash_first, monkeypatch):
    model, _ = blocks.make_flux_stack()
    asked = ("norm_rope", "adaln", "gate", "attention")
    free = registry.choose(_Patcher(model), registry.Request(asked))
    captured = registry.choose(_Patcher(model), registry.Request(asked, graphs_captured=True))
    assert free.attention and captured.attention       # every shipped implementation is capture-safe
    assert captured.ops == free.ops == ("norm_rope", "adaln", "gate")
    unsafe = dataclasses.replace(families.FASTEST_SDPA, needs=dataclasses.replace(
        families.FASTEST_SDPA.needs, capture_safe=False, capture_note="times each call"))
    monkeypatch.setattr(registry, "FASTEST_SDPA", unsafe)
    monkeypatch.setitem(families.FAMILIES, "attention", dataclasses.replace(
        families.FAMILIES["attention"], implementations=(unsafe, families.FP8_ATTENTION)))
    captured = registry.choose(_Patcher(model), registry.Request(asked, graphs_captured=True))
    assert not captured.attention
    assert "attention: stock: fastest_sdpa is not capture-safe (times each call)" in captured.lines[-1]


def test_where_blocks_are_captured_in_cuda_graphs_fp8_linears_stay_stock_and_say_where_it_was_seen(flash_first):
    model, _ = blocks.make_flux_stack()
    captured = registry.choose(_Patcher(model), registry.Request(("fp8_linear",), graphs_captured=True))
    assert "fp8_linear" not in captured.ops
    [line] = [line for line in captured.lines if "linear_fp8_seam is not capture-safe" in line]
    assert "see benchmarks/results/compiler-0.38.1.json: runs[model=flux-dev, mode=cuda_graph]" in line


def test_the_nodes_defaults_run_attention_where_the_release_puts_flash_first(flash_first):
    model, _ = blocks.make_flux_stack()
    selection = registry.choose(_Patcher(model), registry.Request(_node_default_families()))
    assert selection.attention and selection.fp8_weights is None and "fp8_linear" not in selection.ops
    [line] = [line for line in selection.lines if line.startswith("attention: ")]
    assert line.startswith(f"attention: {registry.attention.RUNS} (the release's SDPA order puts FLASH_ATTENTION first")
    assert families.FASTEST_SDPA.faster.cite() in line
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))     # the node as dropped in
    assert "optimized_attention_override" in patched.model_options["transformer_options"]


def test_the_nodes_defaults_leave_attention_stock_where_the_release_puts_cudnn_first(cudnn_first, caplog):
    model, _ = blocks.make_flux_stack()
    state.forget_said()
    assert "attention" not in _node_default_families()        # its toggle defaults off on this release
    asked = (*_node_default_families(), "attention")           # and switched on by hand, it stays stock
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        selection = registry.choose(_Patcher(model), registry.Request(asked))
        registry.choose(_Patcher(model), registry.Request(asked))
    assert not selection.attention
    [line] = [line for line in selection.lines if line.startswith("attention: ")]
    assert line.startswith("attention: stock: the release's SDPA order puts CUDNN_ATTENTION first")
    assert families.FASTEST_SDPA.no_gain.cite() in line
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fused DiT Ops: attention")]
    assert said == [f"Fused DiT Ops: {line}"]
    assert "Stock: attention (CUDNN_ATTENTION is first in this release's SDPA order)" in selection.summary
    for toggles in ({}, {"attention": True}):
        (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), **toggles)
        assert "optimized_attention_override" not in patched.model_options["transformer_options"]


def test_attention_stays_stock_where_the_release_orders_no_sdpa_backends(monkeypatch):
    monkeypatch.delitem(sys.modules, "comfy.ops", raising=False)
    model, _ = blocks.make_flux_stack()
    selection = registry.choose(_Patcher(model), registry.Request(("attention",)))
    assert not selection.attention and "orders no SDPA backends" in selection.lines[-1]


def test_the_exact_families_are_on_by_default_and_fp8_is_opt_in():
    assert _node_default_families() == ("norm_rope", "adaln", "gate", "attention")
    assert not families.FAMILIES["fp8_linear"].node_default


def _node_default_families() -> tuple[str, ...]:
    """The families the node asks for with every input at its default, as ComfyUI sends a dropped-in node's."""
    inputs = node_pack.FusedDiTOps.INPUT_TYPES()
    toggles = {**inputs["required"], **inputs["optional"]}
    return tuple(name for name in families.FAMILIES if toggles[name][1]["default"])


def test_another_nodes_attention_override_keeps_its_choice(flash_first):
    model, _ = blocks.make_flux_stack()
    patcher = _Patcher(model)
    patcher.model_options["transformer_options"]["optimized_attention_override"] = object()
    selection = registry.choose(patcher, registry.Request(("attention",)))
    assert not selection.attention and "another node's attention override" in selection.lines[-1]


def test_each_line_is_said_once_in_the_packs_one_log(caplog):
    model, _ = blocks.make_flux_stack()
    state.forget_said()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        first = registry.choose(_Patcher(model), registry.Request(("norm_rope", "fp8_linear")))
        registry.choose(_Patcher(model), registry.Request(("norm_rope", "fp8_linear")))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fused DiT Ops: ")]
    assert said == [f"Fused DiT Ops: {line}" for line in first.lines]       # the long lines, at DEBUG
    assert all(("Fused DiT Ops: %s", (line,)) in state.STATE.said for line in first.lines)
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "Fused DiT Ops" in r.getMessage()]
    assert info == [f"Fused DiT Ops on {first.summary}"]                    # one line for the model
    assert first.summary.startswith("Flux: runs norm_rope (fused Triton kernels); fp8_linear (FP8 Linears")


def test_the_node_applies_the_decision_and_the_selection_and_nothing_else(monkeypatch):
    model, inputs = blocks.make_wan_stack()
    decide = registry.decide
    monkeypatch.setattr(registry, "decide", lambda patcher, request: dataclasses.replace(
        decide(patcher, request), asked_ops=("gate",), attention=False, fp8_weights=None))
    chosen = registry.Selection(ops=("gate",), wrap=True, attention=False, fp8_weights=None, lines=())
    monkeypatch.setattr(registry, "settle", lambda decision, model=None: chosen)
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), fp8_linear=True, attention=True)
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]
    installed = []

    def call():
        installed.append("forward" in model.blocks[0].__dict__)
        with torch.no_grad():
            return model(**inputs)
    call.class_obj = SimpleNamespace(diffusion_model=model)
    wrapper(call)
    assert installed == [True] and "forward" not in model.blocks[0].__dict__
    assert "optimized_attention_override" not in patched.model_options["transformer_options"]
    assert not patched.callbacks.get("on_cleanup")


def test_a_backend_choice_is_said_at_debug_and_a_decline_at_info(caplog):
    """The node's one INFO line per model says what runs; which backend a call takes is a DEBUG detail, while a family
    the user turned on that stays stock for a call says why at INFO."""
    from fused_dit import dispatch
    state.forget_said()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        dispatch.choose("probe_op", torch.zeros(1))
        dispatch.say_once("probe_op", "stock forward", "a probe's reason")
    levels = {r.getMessage(): r.levelno for r in caplog.records if "probe_op" in r.getMessage()}
    assert [lvl for msg, lvl in levels.items() if "stock forward" not in msg] == [logging.DEBUG]
    assert [lvl for msg, lvl in levels.items() if "stock forward" in msg] == [logging.INFO]
    state.forget_said()
