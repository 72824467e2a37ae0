"""fused_dit.launch: the overlays' kernels called through their compiled launcher, where that was checked.

On CPU only the gate is checked (the interpreter never takes the direct path). On a GPU with a Triton release the
module lists, each quantiser runs twice per input (the second call goes direct) and must give the bytes of the
JIT path (FUSED_DIT_DIRECT_LAUNCH=0), for aligned, misaligned and odd-sized inputs.
"""
from __future__ import annotations

import pytest
import torch

from fused_dit import launch, state
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
    assert launch.direct_enabled() and not state.STATE.launch_given_up


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
    monkeypatch.setattr(launch, "direct_enabled", lambda: not state.STATE.launch_given_up)
    monkeypatch.setattr(launch, "_runtime", lambda: Runtime)
    monkeypatch.setattr(launch, "_raw_stream", lambda device: 7)
    monkeypatch.setattr(launch.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "_compiled", {})
    monkeypatch.setattr(state.STATE, "launch_given_up", [])
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
    assert len(kernel.jit_launches) == 2 and state.STATE.launch_given_up
    launch.launch(kernel, (2, 3), "key", "x")       # the direct path stays off in this process
    assert len(kernel.jit_launches) == 3


def test_specialisation_key_keeps_every_distinction_triton_makes():
    key = launch.specialisation_key
    base = torch.zeros(64, dtype=torch.bfloat16)
    assert key([base]) != key([base[1:]])                      # 16-byte aligned or not
    assert key([base]) != key([base.float()])                  # dtype
    assert key([1]) != key([2]) and key([16]) != key([17])      # == 1, divisible by 16
    assert key([16]) == key([4096]) and key([3]) == key([5])   # the same class: one compiled kernel serves both
    assert key([2 ** 31 - 1]) != key([2 ** 31])                # 32- or 64-bit
    assert key([1e-6]) == key([1e-5])                          # floats are not specialised
    assert key([True]) != key([False]) and key([None]) != key([0])
    with pytest.raises(TypeError, match="no specialisation key"):
        key(["a string"])


class _NamedKernel(_FakeKernel):
    arg_names = ["x_ptr", "n", "BLOCK", "stride", "EVEN"]


def test_launch_args_puts_constexprs_where_the_kernel_declares_them(direct):
    kernel = _NamedKernel(_FakeCompiled())
    x = torch.zeros(8)
    launch.launch_args(kernel, (2,), (x, 64, 1), {"EVEN": True, "BLOCK": 128}, num_warps=4)
    assert kernel.jit_launches == [((2,), (x, 64, 128, 1, True), {"num_warps": 4})]
    launch.launch_args(kernel, (2,), (x, 48, 1), {"EVEN": True, "BLOCK": 128}, num_warps=4)    # same key: direct
    assert len(kernel.jit_launches) == 1 and kernel.compiled.runs[0][-5:] == (x, 48, 128, 1, True)
    launch.launch_args(kernel, (2,), (x, 64, 1), {"EVEN": False, "BLOCK": 128}, num_warps=4)   # a constexpr differs
    launch.launch_args(kernel, (2,), (x, 63, 1), {"EVEN": True, "BLOCK": 128}, num_warps=4)    # 63 % 16 != 0
    assert len(kernel.jit_launches) == 3
    with pytest.raises(TypeError, match="do not fill"):
        launch.launch_args(kernel, (2,), (x, 64), {"EVEN": True, "BLOCK": 128})


@pytest.mark.skipif(not _direct_gpu(), reason="needs an sm_89+ GPU and a Triton release the direct path lists")
def test_direct_launch_of_the_norm_and_gate_kernels_gives_the_jit_paths_bits(monkeypatch, seed):
    """adaln, gate_add and both rms_rope kernels launched a second time with the same specialisation go direct and
    write the bits the JIT path writes, for aligned and misaligned (offset) inputs."""
    import math

    from fused_dit.ops import adaln, gate_add, rms_rope

    gen = generator(seed)
    calls = []
    for offset in (0, 1):
        base = torch.randn(2 * 37 * 3072 + offset, generator=gen).to("cuda", torch.bfloat16)
        x = base[offset:].view(2, 37, 3072)
        e = torch.randn(2, 1, 6, 3072, generator=gen).to("cuda", torch.bfloat16)
        calls += [lambda x=x, e=e: adaln.adaln(x, e[:, :, 0], e[:, :, 1]),
                  lambda x=x, e=e: gate_add.gate_add(x, x.flip(1), e[:, :, 2], gate_add.WAN),
                  lambda x=x, e=e: gate_add.gate_add(x, x.flip(1), e[:, :, 2], gate_add.FLUX)]
    def rotations(*leading):
        angle = torch.rand(*leading, 64, generator=gen).to("cuda") * 2 * math.pi
        return torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], -1).view(*leading, 64, 2, 2)

    qkv = torch.randn(2, 37, 3, 3, 128, generator=gen).to("cuda", torch.bfloat16)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)        # strided views of packed qkv, as in Flux
    scale = torch.rand(128, generator=gen).to("cuda", torch.bfloat16) + 0.5
    pe = rotations(1, 1, 37)
    wq, wk = (torch.randn(2, 37, 1024, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    weight = torch.rand(1024, generator=gen).to("cuda", torch.bfloat16) + 0.5
    freqs = rotations(1, 37, 1)
    calls += [lambda: rms_rope.flux_rms_rope(q, k, scale, scale, pe),
              lambda: rms_rope.wan_rms_rope(wq, wk, weight, weight, freqs, 8)]
    for call in calls:
        monkeypatch.setenv("FUSED_DIT_DIRECT_LAUNCH", "0")
        want = call()
        monkeypatch.delenv("FUSED_DIT_DIRECT_LAUNCH")
        call()                       # compiles (or finds) the kernel and keeps it
        got = call()                 # the direct path
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(a, b)
    assert launch.direct_enabled() and not state.STATE.launch_given_up
