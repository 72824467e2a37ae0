"""FP8 codes in the Linears' place (codes_in_place: the node's fp8_weights="no_extra_memory", earlier "replace",
under ComfyUI's legacy ModelPatcher; issue 13.2), without ComfyUI.

`LifecyclePatcher` is a ModelPatcher written for these tests with the parts of ComfyUI 0.3.64's lifecycle the
swap relies on (comfy/model_patcher.py): object patches applied when a clone loads and restored from a backup
shared by all clones; weight patches (LoRA) baked at load through a module's convert_/set_ methods when it has
them, their originals kept in a shared backup; and the switch between clones: a clone whose patches_uuid differs
from the loaded one's unpatches the weights and moves the model to the offload device first, one with the same
uuid only swaps object patches (partially_load). The same sequence ran against a real ComfyUI
(benchmarks/results/fp8-codes-comfyui.json; its retired script: benchmarks/results/README.md).

On CPU the FP8 GEMM is emulated from the same codes (the fp8_calls fixture); load device and offload device are
both the CPU, so where weights live is checked by identity, not by device.
"""
from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack
from comfy_fakes import FakeModelPatcher
import fused_dit
from fused_dit import families, registry, state
from fused_dit.integration import fp8_linear_modules
from fused_dit.integration.fp8_codes import Fp8CodesLinear


def _get(obj, path):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def _set(obj, path, value):
    *parents, last = path.split(".")
    for name in parents:
        obj = getattr(obj, name)
    previous = getattr(obj, last)
    setattr(obj, last, value)
    return previous


class LifecyclePatcher(FakeModelPatcher):
    def __init__(self, diffusion_model, load_device="cpu"):
        super().__init__(diffusion_model)
        self.model.current_uuid = self.model.loaded_by = None
        self.load_device = self.offload_device = torch.device(load_device)
        self.size = sum(p.numel() * p.element_size() for p in diffusion_model.parameters())
        self.patches: dict = {}
        self.patches_uuid = uuid.uuid4()
        self.object_patches: dict = {}
        self.object_patches_backup: dict = {}      # shared by clones, as in ComfyUI
        self.backup: dict = {}                     # shared by clones

    def clone(self):
        twin = super().clone()                     # the backups stay shared
        twin.patches = {k: list(v) for k, v in self.patches.items()}
        twin.object_patches = dict(self.object_patches)
        return twin

    def add_object_patch(self, name, obj):
        self.object_patches[name] = obj

    def add_patches(self, patches: dict, strength: float = 1.0):
        for key, delta in patches.items():
            self.patches.setdefault(key, []).append((strength, delta))
        self.patches_uuid = uuid.uuid4()

    # the lifecycle
    def _unpatch(self, weights: bool):
        if weights:
            for key, original in self.backup.items():
                _set(self.model, key, torch.nn.Parameter(original.weight, requires_grad=False))
            self.backup.clear()
            self.model.current_uuid = None
        for key, original in self.object_patches_backup.items():
            _set(self.model, key, original)
        self.object_patches_backup.clear()

    def _patch_weight(self, key):
        module_path, attribute = key.rsplit(".", 1)
        module = _get(self.model, module_path)
        weight = getattr(module, attribute)
        self.backup.setdefault(key, SimpleNamespace(weight=weight.detach().clone(), inplace_update=False))
        value = weight.detach().float()
        convert = getattr(module, f"convert_{attribute}", None)
        if convert is not None:
            value = convert(value, inplace=True)
        for strength, delta in self.patches[key]:
            value = value + strength * delta
        setter = getattr(module, f"set_{attribute}", None)
        if setter is not None:
            setter(value, seed=0)
        else:
            _set(self.model, key, torch.nn.Parameter(value.to(weight.dtype), requires_grad=False))

    def load(self):
        """load_models_gpu for this clone: what partially_load and patch_model do."""
        state = self.model
        if state.loaded_by is self:
            return
        self._unpatch(weights=state.current_uuid is not None and state.current_uuid != self.patches_uuid)
        for key, value in self.object_patches.items():
            previous = _set(self.model, key, value)
            self.object_patches_backup.setdefault(key, previous)
        if state.current_uuid is None:
            for key in self.patches:
                self._patch_weight(key)
            state.current_uuid = self.patches_uuid
        state.loaded_by = self

    def prepare(self):
        """ComfyUI's prepare_sampling for this clone: its PREPARE_SAMPLING wrappers around load_models_gpu."""
        wrappers = self.wrappers.get("prepare_sampling", {}).get(node_pack.WRAPPER_KEY, [])
        load = lambda patcher, *args, **kwargs: patcher.load()    # noqa: E731
        return wrappers[0](load, self, (1,), []) if wrappers else load(self)

    def sample(self, inputs):
        """One model call as a sampler makes it: prepare_sampling, then BaseModel.apply_model through the node's
        APPLY_MODEL wrapper if any."""
        self.prepare()
        diffusion_model = self.model.diffusion_model

        def call():
            with torch.inference_mode():
                return diffusion_model(**{k: v.clone() for k, v in inputs.items()})
        call.class_obj = SimpleNamespace(diffusion_model=diffusion_model)
        wrappers = self.wrappers.get("apply_model", {}).get(node_pack.WRAPPER_KEY, [])
        return wrappers[0](call) if wrappers else call()


MAKERS = {"flux": blocks.make_flux_stack, "wan": blocks.make_wan_stack}


def _node(patcher, fp8_weights=families.NO_EXTRA_MEMORY):
    (patched,) = node_pack.FusedDiTOps().patch(patcher, fp8_linear=True, fp8_weights=fp8_weights)
    return patched


def _prepared(patched):
    """`patched` after the node's PREPARE_SAMPLING hook, as a sampler's first prepare_sampling runs it, without the
    load that follows (the codes are object patches; ComfyUI puts them in the tree when it loads the clone)."""
    [hook] = patched.wrappers["prepare_sampling"][node_pack.WRAPPER_KEY]
    hook(lambda patcher, *args, **kwargs: None, patched, (1,), [])
    return patched


def _codes_in_tree(model) -> int:
    return sum(isinstance(m, Fp8CodesLinear) for m in model.modules())


@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_replace_swaps_every_fp8_linear_through_object_patches_of_the_clone_only(model_name, fp8_calls):
    model, _ = MAKERS[model_name](dtype=torch.bfloat16)
    base = LifecyclePatcher(model)
    size, base_uuid = base.size, base.patches_uuid
    patched = _node(base)
    assert not patched.object_patches and not fp8_calls and patched.size == size    # the node's run quantises nothing
    _prepared(patched)                                        # the first sampling does, before ComfyUI loads
    names = [f"diffusion_model.{name}" for name, _ in fp8_linear_modules(model)]
    assert sorted(patched.object_patches) == sorted(names) and names
    assert all(isinstance(m, Fp8CodesLinear) and m.weight.dtype == torch.float8_e4m3fn
               for m in patched.object_patches.values())
    assert not base.object_patches and base.patches_uuid == base_uuid and base.size == size   # the input MODEL
    assert patched.patches_uuid != base_uuid                  # ComfyUI unpatches the weights when switching
    saved = sum(_get(SimpleNamespace(diffusion_model=model), n).weight.numel() for n in names)   # 2 -> 1 byte
    assert size - patched.size == saved - 4 * len(names)
    assert _codes_in_tree(model) == 0                         # nothing in the tree changes before ComfyUI loads


@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_replace_gives_the_alongside_bits_and_switching_back_restores_stock(model_name, fp8_calls):
    model, inputs = MAKERS[model_name](dtype=torch.bfloat16)
    modules_before = dict(model.named_modules())
    weights_before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    base = LifecyclePatcher(model)
    replace, alongside = _node(base), _node(base, "alongside")

    stock = base.sample(inputs)
    with_codes = replace.sample(inputs)
    assert _codes_in_tree(model) == len(replace.object_patches)
    calls = len(fp8_calls)
    beside = alongside.sample(inputs)
    assert _codes_in_tree(model) == 0 and len(fp8_calls) == 2 * calls > 0
    assert torch.equal(with_codes, beside)                    # the same codes, scales and GEMM
    again = base.sample(inputs)
    assert torch.equal(again, stock)
    assert dict(model.named_modules()).keys() == modules_before.keys()
    assert all(m is modules_before[n] for n, m in model.named_modules())
    assert all(torch.equal(v, weights_before[k]) for k, v in model.state_dict().items())


def test_the_stock_forward_of_a_codes_linear_is_the_dequantised_weight_with_comfy_functions():
    linear = torch.nn.Linear(32, 16).bfloat16()
    codes = Fp8CodesLinear.from_linear(linear, linear.weight, torch.device("cpu"), torch.device("cpu"))
    x = torch.randn(3, 32).bfloat16()
    dequantised = codes.weight.to(torch.bfloat16) * codes.scale_weight.to(torch.bfloat16)
    assert torch.equal(codes(x), torch.nn.functional.linear(x, dequantised, linear.bias))
    assert codes.bias is linear.bias                          # shared, not copied
    # ComfyUI's low-VRAM functions: the weight function sees the codes' values, before the scale
    codes.weight_function = [lambda w: w * 2]
    codes.bias_function = [lambda b: b + 1]
    expected = torch.nn.functional.linear(x, dequantised * 2, linear.bias + 1)
    assert torch.equal(codes(x), expected)


def test_convert_and_set_weight_round_trip_the_codes_at_a_fixed_scale():
    linear = torch.nn.Linear(32, 16).bfloat16()
    module = Fp8CodesLinear.from_linear(linear, linear.weight, torch.device("cpu"), torch.device("cpu"))
    codes, scale = module.weight.detach().clone(), module.scale_weight.detach().clone()
    module.set_weight(module.convert_weight(module.weight.detach().float()))
    assert torch.equal(module.weight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(module.scale_weight, scale)
    # past the codes' range the values saturate instead of becoming NaN
    huge = module.set_weight(torch.full((16, 32), 1e9), return_weight=True)
    assert torch.isfinite(huge.float()).all() and huge.float().max() == torch.finfo(torch.float8_e4m3fn).max


def test_a_lora_added_before_the_node_is_baked_into_the_codes_and_undone_after(fp8_calls):
    model, inputs = blocks.make_flux_stack(dtype=torch.bfloat16)
    base = LifecyclePatcher(model)
    stock = base.sample(inputs)
    name = "diffusion_model.double_blocks.0.img_mlp.0"
    weight = _get(SimpleNamespace(diffusion_model=model), name).weight.detach()
    lora = base.clone()
    lora.add_patches({f"{name}.weight": 0.5 * weight.float().abs().mean() * torch.randn(weight.shape)})
    lora_stock = lora.sample(inputs)
    lora_codes = _node(lora).sample(inputs)
    plain_codes = _node(base).sample(inputs)
    error = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
    assert error(lora_codes, lora_stock) < error(lora_codes, stock)
    assert error(lora_codes, lora_stock) <= 2 * error(plain_codes, stock)
    assert torch.equal(base.sample(inputs), stock)
    assert torch.equal(_get(SimpleNamespace(diffusion_model=model), name).weight, weight)


def test_codes_come_from_the_weights_before_lora_while_a_patched_model_is_loaded(fp8_calls):
    model, inputs = blocks.make_wan_stack(dtype=torch.bfloat16)
    base = LifecyclePatcher(model)
    name = "diffusion_model.blocks.0.ffn.0"
    original = _get(SimpleNamespace(diffusion_model=model), name).weight.detach().clone()
    lora = base.clone()
    lora.add_patches({f"{name}.weight": torch.ones(original.shape)})
    lora.sample(inputs)                                       # loaded: the tree holds the LoRA'd weight
    assert not torch.equal(_get(SimpleNamespace(diffusion_model=model), name).weight, original)
    codes = _prepared(_node(lora)).object_patches[name]
    expected = Fp8CodesLinear.from_linear(torch.nn.Linear(1, 1), original, torch.device("cpu"), torch.device("cpu"))
    assert torch.equal(codes.weight.view(torch.uint8), expected.weight.view(torch.uint8))


def test_a_second_node_run_while_codes_are_loaded_quantises_the_originals(fp8_calls):
    model, inputs = blocks.make_flux_stack(dtype=torch.bfloat16)
    base = LifecyclePatcher(model)
    first = _node(base)
    out = first.sample(inputs)
    assert _codes_in_tree(model) > 0
    second = _prepared(_node(base))                           # e.g. another toggle changed: the node runs again
    assert sorted(second.object_patches) == sorted(first.object_patches)
    assert all(torch.equal(second.object_patches[k].weight.view(torch.uint8), m.weight.view(torch.uint8))
               for k, m in first.object_patches.items())
    assert torch.equal(second.sample(inputs), out)


def test_no_extra_memory_registers_nothing_where_the_fp8_forward_cannot_run(caplog):
    # CPU without the test's FP8 emulation: dispatch declines fp8_linear, codes would only lose precision
    model, inputs = blocks.make_flux_stack(dtype=torch.bfloat16)
    state.forget_said()
    with caplog.at_level(logging.DEBUG, logger="fused_dit"):
        patched = _node(LifecyclePatcher(model))
        patched.sample(inputs)                                # the model's lines come at its first call
    assert not patched.object_patches and not patched.wrappers.get("prepare_sampling")
    selection = registry.choose(LifecyclePatcher(model), registry.Request(("fp8_linear",)))
    assert selection.fp8_weights is None and "fp8_linear" in selection.ops
    assert any("fp8_weights: no_extra_memory left the bf16 weights (" in r.getMessage()
               for r in caplog.records)


def test_the_node_refuses_an_unknown_fp8_weights_value():
    model, _ = blocks.make_flux_stack()
    with pytest.raises(ValueError, match="fp8_weights='gpu'; expected one of no_extra_memory, codes_beside_weights, "
                                         "replace, alongside"):
        node_pack.FusedDiTOps().patch(LifecyclePatcher(model), fp8_linear=True, fp8_weights="gpu")


def test_the_node_offers_the_fp8_weight_policies_and_their_earlier_names():
    optional = node_pack.FusedDiTOps.INPUT_TYPES()["optional"]
    choices, options = optional["fp8_weights"]
    assert choices == ["no_extra_memory", "codes_beside_weights", "replace", "alongside"]
    assert options["default"] == "no_extra_memory"


@pytest.mark.parametrize("earlier, policy", [("replace", "no_extra_memory"), ("alongside", "codes_beside_weights")])
def test_a_saved_workflows_earlier_fp8_weights_name_does_what_its_policy_does(fp8_calls, earlier, policy):
    model, _ = blocks.make_flux_stack(dtype=torch.bfloat16)
    base = LifecyclePatcher(model)
    by_name, by_alias = (_node(base, value) for value in (policy, earlier))
    for patched in (by_name, by_alias):
        patched.prepare()
    assert sorted(by_name.object_patches) == sorted(by_alias.object_patches)
    assert bool(by_name.object_patches) == (policy == "no_extra_memory")
    chosen = [registry.choose(base, registry.Request(("fp8_linear",), value)) for value in (policy, earlier)]
    assert chosen[0] == chosen[1]


def test_fp8_linear_modules_lists_what_enable_runs_in_fp8_without_installing_anything():
    model, _ = blocks.make_wan_stack(dtype=torch.bfloat16)
    listed = fp8_linear_modules(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    report = fused_dit.enable(model, ops=("fp8_linear",))
    fused_dit.disable(model)
    assert len(listed) == report["fp8_linears"] > 0
    assert not any("modulation" in name for name, _ in listed)
