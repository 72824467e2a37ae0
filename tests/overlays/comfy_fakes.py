"""A ModelPatcher fake with the methods the Fused DiT ops node calls, for tests without ComfyUI.

clone, add_wrapper_with_key / remove_wrappers_with_key, add_callback_with_key / remove_callbacks_with_key,
`model_options` (its transformer_options copied by clone, as ComfyUI copies nested dicts) and
`.model.diffusion_model`, as comfy.model_patcher.ModelPatcher has them; test_fp8_codes.py extends it with the
loading lifecycle.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace


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
