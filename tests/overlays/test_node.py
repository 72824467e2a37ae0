"""The ComfyUI node and prestartup script, without ComfyUI.

Faked: a ModelPatcher with the methods the node calls (clone, add_wrapper_with_key, remove_wrappers_with_key,
add_callback_with_key, remove_callbacks_with_key, `.model.diffusion_model`) and a WrapperExecutor-like object
(`class_obj` = the BaseModel holding `diffusion_model`, callable). The hook names fall back to ComfyUI's literal
values ("apply_model", "on_cleanup") when comfy.patcher_extension is not importable.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import blocks
import comfyui_fused_dit as node_pack

PRESTARTUP = Path(node_pack.__file__).with_name("prestartup_script.py")


class FakeModelPatcher:
    def __init__(self, diffusion_model):
        self.model = SimpleNamespace(diffusion_model=diffusion_model)
        self.wrappers: dict = {}
        self.callbacks: dict = {}

    def clone(self):
        twin = FakeModelPatcher(self.model.diffusion_model)
        twin.model = self.model
        twin.wrappers = {t: {k: list(v) for k, v in d.items()} for t, d in self.wrappers.items()}
        twin.callbacks = {t: {k: list(v) for k, v in d.items()} for t, d in self.callbacks.items()}
        return twin

    def add_wrapper_with_key(self, wrapper_type, key, wrapper):
        self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(wrapper)

    def remove_wrappers_with_key(self, wrapper_type, key):
        self.wrappers.get(wrapper_type, {}).pop(key, None)

    def add_callback_with_key(self, call_type, key, callback):
        self.callbacks.setdefault(call_type, {}).setdefault(key, []).append(callback)

    def remove_callbacks_with_key(self, call_type, key):
        self.callbacks.get(call_type, {}).pop(key, None)


class FakeExecutor:
    """Calls the model the way BaseModel._apply_model ends up calling diffusion_model."""

    def __init__(self, diffusion_model, inputs):
        self.class_obj = SimpleNamespace(diffusion_model=diffusion_model)
        self.inputs = inputs

    def __call__(self):
        with torch.no_grad():
            return self.class_obj.diffusion_model(**{k: v.clone() for k, v in self.inputs.items()})


def test_node_is_registered_with_model_in_and_out():
    node = node_pack.NODE_CLASS_MAPPINGS["FusedDiTOps"]
    required = node.INPUT_TYPES()["required"]
    assert required["model"] == ("MODEL",) and node.RETURN_TYPES == ("MODEL",)
    assert {"norm_rope", "adaln", "gate", "fp8_linear"} <= set(required)


def test_node_clones_and_wraps_apply_model_with_swap_and_restore():
    model, inputs = blocks.make_wan_stack()
    patcher = FakeModelPatcher(model)
    (patched,) = node_pack.FusedDiTOps().patch(patcher, norm_rope=True, adaln=True, gate=True, fp8_linear=True)
    assert patched is not patcher and not patcher.wrappers
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]
    seen_during_call = {}

    class SpyExecutor(FakeExecutor):
        def __call__(self):
            seen_during_call["overlay"] = "forward" in model.blocks[0].__dict__
            return super().__call__()

    out = wrapper(SpyExecutor(model, inputs))
    assert seen_during_call["overlay"]
    assert "forward" not in model.blocks[0].__dict__          # restored in finally
    assert (out - blocks.run(model, inputs)).abs().max() <= 1e-5 * out.abs().max()
    assert node_pack.WRAPPER_KEY in patched.callbacks["on_cleanup"]


def test_node_restores_forwards_when_the_model_call_raises():
    model, inputs = blocks.make_flux_stack()
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model))
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]

    class FailingExecutor(FakeExecutor):
        def __call__(self):
            raise RuntimeError("sampling interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        wrapper(FailingExecutor(model, inputs))
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_node_refuses_unsupported_models_clearly():
    with pytest.raises(ValueError, match="supports ComfyUI's Flux .* and Wan"):
        node_pack.FusedDiTOps().patch(FakeModelPatcher(torch.nn.Linear(4, 4)))


def test_node_with_every_toggle_off_adds_no_wrapper():
    model, _ = blocks.make_wan_stack()
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), False, False, False, False)
    assert not patched.wrappers.get("apply_model")


def _load_prestartup():
    spec = importlib.util.spec_from_file_location("fused_dit_prestartup_under_test", PRESTARTUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_state(root: Path, files: dict[str, bytes]) -> None:
    state = {"applied": {"comfyui/max-resolution": {"files": [
        {"path": str(root / name), "sha256_after": hashlib.sha256(data).hexdigest()} for name, data in files.items()]}}}
    (root / ".applier").mkdir()
    (root / ".applier" / "state.json").write_text(json.dumps(state))


def test_prestartup_warns_once_when_a_patched_file_changed(tmp_path):
    prestartup = _load_prestartup()
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 32768\n")
    _write_state(tmp_path, {"nodes.py": b"MAX_RESOLUTION = 32768\n"})
    stream = io.StringIO()
    assert prestartup.warn_if_lost(tmp_path, stream) == [] and stream.getvalue() == ""
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 16384\n")   # an update put the original back
    assert prestartup.warn_if_lost(tmp_path, stream) == ["comfyui/max-resolution"]
    line = stream.getvalue()
    assert line.count("\n") == 1 and "lost by an update" in line and f"applier apply --target {tmp_path}" in line


@pytest.mark.parametrize("content", [None, "{not json", "[]", '{"applied": {"x": {"files": [{"path": 1}]}}}'])
def test_prestartup_is_silent_without_a_readable_state(tmp_path, content):
    prestartup = _load_prestartup()
    if content is not None:
        (tmp_path / ".applier").mkdir()
        (tmp_path / ".applier" / "state.json").write_text(content)
    stream = io.StringIO()
    assert prestartup.warn_if_lost(tmp_path, stream) == [] and stream.getvalue() == ""


def test_prestartup_is_silent_when_two_patches_share_a_file(tmp_path):
    # max-resolution then pil-pixel-limit both edit nodes.py: the first one's sha256_after is no longer the file's,
    # the later one's (by seq) is; nothing was lost.
    prestartup = _load_prestartup()
    first, second = b"MAX_RESOLUTION = 40960\n", b"MAX_RESOLUTION = 40960\nImage.MAX_IMAGE_PIXELS = 1\n"
    (tmp_path / "nodes.py").write_bytes(second)
    path = str(tmp_path / "nodes.py")
    state = {"applied": {
        "comfyui/pil-pixel-limit": {"seq": 2, "files": [{"path": path,
                                                         "sha256_after": hashlib.sha256(second).hexdigest()}]},
        "comfyui/max-resolution": {"seq": 1, "files": [{"path": path,
                                                        "sha256_after": hashlib.sha256(first).hexdigest()}]}}}
    (tmp_path / ".applier").mkdir()
    (tmp_path / ".applier" / "state.json").write_text(json.dumps(state))
    stream = io.StringIO()
    assert prestartup.warn_if_lost(tmp_path, stream) == [] and stream.getvalue() == ""
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 16384\n")
    assert prestartup.warn_if_lost(tmp_path, stream) == ["comfyui/max-resolution", "comfyui/pil-pixel-limit"]
