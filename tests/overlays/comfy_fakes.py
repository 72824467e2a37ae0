"""A ModelPatcher fake with the methods the Fused DiT ops node calls, for tests without ComfyUI.

clone, add_wrapper_with_key / remove_wrappers_with_key, add_callback_with_key / remove_callbacks_with_key,
`model_options` (its transformer_options copied by clone, as ComfyUI copies nested dicts) and
`.model.diffusion_model`, as comfy.model_patcher.ModelPatcher has them; test_fp8_codes.py extends it with the
loading lifecycle. `call_model` makes one model call through the node's APPLY_MODEL wrapper, where the node does
what needs the model's blocks at its first call.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

WRAPPER_KEY = "fused_dit"      # the node's (comfyui_fused_dit.WRAPPER_KEY)


class FakeModelPatcher:
    def __init__(self, diffusion_model):
        self.model = SimpleNamespace(diffusion_model=diffusion_model)
        self.wrappers: dict = {}
        self.callbacks: dict = {}
        self.model_options: dict = {"transformer_options": {}}

    def clone(self):
        twin = copy.copy(self)        # shares `.model`, as ComfyUI's clones share the model
        twin.wrappers = {t: {k: list(v) for k, v in d.items()} for t, d in self.wrappers.items()}
        twin.callbacks = {t: {k: list(v) for k, v in d.items()} for t, d in self.callbacks.items()}
        twin.model_options = {k: dict(v) if isinstance(v, dict) else v for k, v in self.model_options.items()}
        return twin

    def add_wrapper_with_key(self, wrapper_type, key, wrapper):
        self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(wrapper)

    def remove_wrappers_with_key(self, wrapper_type, key):
        self.wrappers.get(wrapper_type, {}).pop(key, None)

    def add_callback_with_key(self, call_type, key, callback):
        self.callbacks.setdefault(call_type, {}).setdefault(key, []).append(callback)

    def remove_callbacks_with_key(self, call_type, key):
        self.callbacks.get(call_type, {}).pop(key, None)


def call_model(patcher, *args, **kwargs):
    """One model call as BaseModel.apply_model makes it: `patcher`'s diffusion model on copies of the tensors in
    `args` and `kwargs`, through the node's APPLY_MODEL wrapper where the patcher has one (the executor's class_obj
    is the BaseModel)."""
    diffusion_model = patcher.model.diffusion_model
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    def run(*a, **k):
        with torch.no_grad():
            return diffusion_model(*a, **k)
    run.class_obj = SimpleNamespace(diffusion_model=diffusion_model)
    wrappers = patcher.wrappers.get("apply_model", {}).get(WRAPPER_KEY, [])
    return wrappers[0](run, *args, **kwargs) if wrappers else run(*args, **kwargs)
