"""Overlay tests: make `fused_dit` importable and run Triton kernels on CPU through the interpreter.

TRITON_INTERPRET must be set before triton is imported (triton.jit decides at decoration time whether a kernel
is interpreted), so it is set here, at collection, when no CUDA device is present.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

OVERLAYS = Path(__file__).resolve().parents[2] / "overlays"
if str(OVERLAYS) not in sys.path:
    sys.path.insert(0, str(OVERLAYS))


def _cuda_present() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


if not _cuda_present():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if _cuda_present() else "cpu"


@pytest.fixture
def seed() -> int:
    """Fresh inputs each run; the seed is in the test id's output when a test fails."""
    from fused_dit.testing import random_seed
    value = random_seed()
    print(f"seed={value}")
    return value


@pytest.fixture
def fp8_calls(monkeypatch) -> list[str]:
    """Dispatch accepts the fp8_linear op on CPU; every call of the FP8 path is recorded ("linear", or
    "gelu_linear" for an FFN's second Linear) and emulated from the same codes (linear_fp8 on CPU)."""
    import torch.nn.functional as F
    from fused_dit import dispatch
    from fused_dit.ops import fp8_linear as fl

    calls: list[str] = []
    real_choose = dispatch.choose

    def choose(op, *tensors, min_capability=None):
        if op == fl.OP:
            return dispatch.Choice("triton", "test: the FP8 GEMM emulated on CPU")
        return real_choose(op, *tensors, min_capability=min_capability)

    def linear(x, weight, bias, settings=fl.SETTINGS):
        calls.append("linear")
        return fl.linear_fp8(x, weight, bias, settings=settings)

    def gelu_linear(h, weight, bias, settings=fl.SETTINGS):
        calls.append("gelu_linear")
        return fl.linear_fp8(F.gelu(h, approximate="tanh"), weight, bias, settings=settings)

    monkeypatch.setattr(dispatch, "choose", choose)
    monkeypatch.setattr(fl, "linear_fp8_triton", linear)
    monkeypatch.setattr(fl, "gelu_linear_fp8_triton", gelu_linear)
    return calls
