"""The path from the node to a kernel crosses at most five pack modules (issue 29).

Counted at every kernel launch of a model call made through the node: the distinct pack modules (files under
overlays/) on the Python stack, from the APPLY_MODEL wrapper FusedDiTOps.patch installed down to launch.py, through
which every op launches its kernels. ComfyUI's own frames (here the fixtures') are not counted. Each family is
measured alone, as a user turns it on: the element-wise families on the 0.3.64-shaped blocks, whose legacy block
forwards run them; FP8 on its own, with the GPU work stubbed (fp8_host_harness), under the legacy ModelPatcher
(codes in the weights' place) and under DynamicVRAM (ComfyUI's cast per call).
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import blocks
import comfy_2026_ops as comfy_ops
import comfyui_fused_dit as node_pack
from comfy_fakes import FakeModelPatcher
from fp8_host_harness import host_only_fp8
from fused_dit import launch, state
from fused_dit.integration import eras
from fused_dit.ops import gelu_quantize_fp8, quantize_fp8, quantize_fp8_rows
from test_fp8_codes import LifecyclePatcher

OVERLAYS = Path(__file__).resolve().parents[2] / "overlays"
MOST_MODULES = 5


def pack_module(code) -> str | None:
    path = Path(code.co_filename)
    if OVERLAYS not in path.parents:
        return None
    parts = list(path.relative_to(OVERLAYS).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def pack_chain(frame) -> tuple[str, ...]:
    """The pack modules on the stack from the outermost frame down to `frame`, each run of one module once."""
    chain: list[str] = []
    while frame is not None:
        name = pack_module(frame.f_code)
        if name and (not chain or chain[-1] != name):
            chain.append(name)
        frame = frame.f_back
    return tuple(reversed(chain))


def recording(launcher, chains: list):
    """`launcher` (launch.launch, or what a harness put in its place), appending the pack chain of each call to
    `chains`; a stand-in for launch.py counts as launch.py."""
    def record(*args, **kwargs):
        chain = pack_chain(sys._getframe(1))
        chains.append(chain if chain[-1:] == ("fused_dit.launch",) else chain + ("fused_dit.launch",))
        return launcher(*args, **kwargs)
    return record


def _through_the_node(model, inputs, **toggles):
    (patched,) = node_pack.FusedDiTOps().patch(FakeModelPatcher(model), **toggles)
    [wrapper] = patched.wrappers["apply_model"][node_pack.WRAPPER_KEY]

    def call():
        with torch.no_grad():
            return model(**{k: v.clone() for k, v in inputs.items()})
    call.class_obj = SimpleNamespace(diffusion_model=model)
    return wrapper(call)


def _assert_short(chains):
    assert chains, "no kernel was launched"
    for chain in set(chains):
        assert chain[0] == "comfyui_fused_dit" and chain[-1] == "fused_dit.launch", chain
        assert len(set(chain)) <= MOST_MODULES, " -> ".join(chain)


@pytest.mark.parametrize("make, module", [(blocks.make_flux_stack, "fused_dit.integration.flux"),
                                          (blocks.make_wan_stack, "fused_dit.integration.wan")], ids=["flux", "wan"])
def test_an_element_wise_kernel_is_four_modules_from_the_node(make, module, monkeypatch):
    # the three families on at once: each launch's chain is its own family's, whatever else runs in the block
    model, inputs = make()
    chains: list = []
    monkeypatch.setattr(launch, "launch", recording(launch.launch, chains))     # what launch_args calls
    _through_the_node(model, inputs, norm_rope=True, adaln=True, gate=True, fp8_linear=False)
    _assert_short(chains)
    assert {chain[:2] for chain in chains} == {("comfyui_fused_dit", module)}
    assert {chain[2] for chain in chains} == {"fused_dit.ops.rms_rope", "fused_dit.ops.adaln", "fused_dit.ops.gate_add"}
    assert {len(set(chain)) for chain in chains} == {4}


@pytest.fixture
def comfy_2026_linears_verified():
    for label, cls in (("call path: 2026 ops", comfy_ops.Linear),):
        state.add_verified(eras.LINEAR_VARIANT, label, {eras.LINEAR_FORWARD: eras.fingerprint_of(cls.forward)[0]})
    yield
    state.remove_verified(eras.LINEAR_VARIANT, "call path: 2026 ops")


@pytest.mark.parametrize("setting", ["legacy", "dynamic"])
def test_an_fp8_kernel_is_five_modules_from_the_node(setting, comfy_2026_linears_verified):
    model, inputs = blocks.make_flux_stack(hidden=64, dtype=torch.bfloat16, comfy_state="newer")
    if setting == "dynamic":
        model = comfy_ops.to_comfy_ops(model)
        patcher = comfy_ops.DynamicPatcher(model)
    else:
        patcher = LifecyclePatcher(model)
    chains: list = []
    with host_only_fp8():
        # the harness's stand-ins for launch.launch
        for ops_module in (quantize_fp8, gelu_quantize_fp8, quantize_fp8_rows):
            ops_module.run_kernel = recording(ops_module.run_kernel, chains)
        (patched,) = node_pack.FusedDiTOps().patch(patcher, norm_rope=False, adaln=False, gate=False,
                                                   fp8_linear=True)
        patched.sample(inputs)
    _assert_short(chains)
    assert {chain[1] for chain in chains} == {"fused_dit.integration.fp8_modules"}
