"""fused_dit.launch: the FP8 quantisers' kernels called through their compiled launcher, where that was checked.

On CPU only the gate is checked (the interpreter never takes the direct path). On a GPU with a Triton release the
module lists, each quantiser runs twice per input (the second call goes direct) and must give the bytes of the
JIT path (FUSED_DIT_DIRECT_LAUNCH=0), for aligned, misaligned and odd-sized inputs.
"""
from __future__ import annotations

import pytest
import torch

from fused_dit import launch
from fused_dit.testing import byte_mismatch, generator


def test_direct_path_is_off_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not launch.direct_enabled()


def test_direct_path_can_be_switched_off(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("FUSED_DIT_DIRECT_LAUNCH", "0")
    assert not launch.direct_enabled()


def _direct_gpu() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        return False
    import os
    return os.environ.get("TRITON_INTERPRET") != "1" and launch._runtime() is not None


@pytest.mark.skipif(not _direct_gpu(), reason="needs an sm_89+ GPU and a Triton release the direct path lists")
@pytest.mark.parametrize("shape,offset", [((64, 256), 0), ((997, 48), 0), ((64, 256), 3)])
def test_direct_launch_writes_the_jit_paths_bytes(shape, offset, monkeypatch, seed):
    from fused_dit.ops import gelu_quantize_fp8 as gq
    from fused_dit.ops import quantize_fp8 as qf

    n = shape[0] * shape[1]
    base = torch.randn(n + offset, generator=generator(seed)).mul(3).to("cuda", torch.bfloat16)
    x = base[offset:].view(shape)          # offset 3: a view whose data is not 16-byte aligned
    for quantize in (qf.quantize_dynamic_triton, gq.gelu_quantize_dynamic_triton):
        monkeypatch.setenv("FUSED_DIT_DIRECT_LAUNCH", "0")
        want_codes, want_scale = quantize(x)
        monkeypatch.delenv("FUSED_DIT_DIRECT_LAUNCH")
        before = len(launch._compiled)
        quantize(x)                        # compiles (or finds) the kernels and keeps them
        assert len(launch._compiled) >= before
        codes, scale = quantize(x)         # the direct path
        assert byte_mismatch(codes, want_codes)[0] == 0
        assert byte_mismatch(scale.reshape(1), want_scale.reshape(1))[0] == 0
    assert launch.direct_enabled() and not launch._broken


class _FakeCompiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, refuse=False):
        self.runs, self.refuse = [], refuse

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        if self.refuse:
            raise TypeError("launcher takes other arguments")
        self.runs.append(args)


class _FakeKernel:
    """kernel[grid](*args, **options) records the JIT launch and returns the compiled kernel, as Triton's does."""

    def __init__(self, compiled):
        self.compiled, self.jit_launches = compiled, []

    def __getitem__(self, grid):
        def jit(*args, **options):
            self.jit_launches.append((grid, args, options))
            return self.compiled
        return jit


@pytest.fixture
def direct(monkeypatch):
    """launch() with its direct path on and no GPU behind it (stream 7, device 0, no launch hooks)."""
    class Runtime:
        launch_enter_hook = launch_exit_hook = None
    monkeypatch.setattr(launch, "direct_enabled", lambda: not launch._broken)
    monkeypatch.setattr(launch, "_runtime", lambda: Runtime)
    monkeypatch.setattr(launch, "_raw_stream", lambda device: 7)
    monkeypatch.setattr(launch.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "_compiled", {})
    monkeypatch.setattr(launch, "_broken", [])
    return Runtime


def test_first_call_of_a_key_goes_through_the_jit_and_repeats_go_direct(direct):
    kernel = _FakeKernel(_FakeCompiled())
    launch.launch(kernel, (4,), ("bf16", True, 64), "x", 64, 8, num_warps=4)
    assert len(kernel.jit_launches) == 1 and not kernel.compiled.runs
    launch.launch(kernel, (4,), ("bf16", True, 64), "y", 64, 8, num_warps=4)
    assert len(kernel.jit_launches) == 1
    assert kernel.compiled.runs == [(4, 1, 1, 7, "fn", "meta", None, None, None, "y", 64, 8)]


def test_another_key_or_other_options_compile_again(direct):
    kernel = _FakeKernel(_FakeCompiled())
    launch.launch(kernel, (4,), ("bf16", True, 64), "x", num_warps=4)
    launch.launch(kernel, (4,), ("bf16", False, 64), "x", num_warps=4)     # misaligned input: its own key
    launch.launch(kernel, (4,), ("bf16", True, 64), "x", num_warps=8)      # another compile option
    assert len(kernel.jit_launches) == 3 and not kernel.compiled.runs


def test_a_launcher_that_refuses_the_call_falls_back_to_the_jit_for_good(direct):
    kernel = _FakeKernel(_FakeCompiled(refuse=True))
    launch.launch(kernel, (2, 3), "key", "x")
    launch.launch(kernel, (2, 3), "key", "x")       # direct attempt refused: launched through the JIT instead
    assert len(kernel.jit_launches) == 2 and launch._broken
    launch.launch(kernel, (2, 3), "key", "x")       # the direct path stays off in this process
    assert len(kernel.jit_launches) == 3
