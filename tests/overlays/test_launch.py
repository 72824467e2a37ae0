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
