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
# the RoPE seam is off by default (measured slower than comfy-kitchen's CUDA kernel); its tests switch it on, and
# test_eras checks the default
os.environ.setdefault("FUSED_DIT_SEAMS", "rope_ck_seam")

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
def fp8_calls() -> list[str]:
    """Dispatch accepts the fp8_linear op on CPU; every call of the FP8 path is recorded ("linear", or
    "gelu_linear" for an FFN's second Linear) and emulated from the same codes (fused_dit.testing.fp8_emulated)."""
    from fused_dit.testing import fp8_emulated

    with fp8_emulated([]) as calls:
        yield calls


def _accept_the_fixture_era() -> None:
    """The project's ComfyUI-shaped blocks (blocks.py) follow ComfyUI 0.3.64's math but are not its code: their
    fingerprints are accepted as one more verified era of the block-forward variants and the FP8 Linear seam, as a
    maintainer records a real release."""
    import blocks
    import era_blocks
    from fused_dit import state
    from fused_dit.integration import add_verified_model, model_fingerprints, seams

    flux, _ = blocks.make_flux_stack(depth=1, depth_single=1)
    wan, _ = blocks.make_wan_stack(depth=1)
    for model in (flux, wan):
        add_verified_model(model, FIXTURE_ERA)
    # of the 2026-shaped fixtures only the RoPE seam is accepted: their block forwards must match nothing
    state.add_verified(seams.ROPE_VARIANT, ERA_2026,
                          model_fingerprints(era_blocks.make_flux()[0])[seams.ROPE_VARIANT])


FIXTURE_ERA = "tests/overlays/blocks.py"
ERA_2026 = "tests/overlays/era_blocks.py"
_accept_the_fixture_era()



def _sdpa_order(monkeypatch, backends: tuple[str, ...]) -> None:
    """A loaded ComfyUI whose comfy.ops orders the SDPA backends `backends` (the attention family reads it)."""
    from types import SimpleNamespace
    monkeypatch.setitem(sys.modules, "comfy.ops", SimpleNamespace(SDPA_BACKEND_PRIORITY=list(backends)))


@pytest.fixture
def flash_first(monkeypatch) -> None:
    """A release whose SDPA order puts FLASH first (0.29+ on Linux), where the attention family runs."""
    _sdpa_order(monkeypatch, ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"))


@pytest.fixture
def cudnn_first(monkeypatch) -> None:
    """A release whose SDPA order puts cuDNN first (0.3.64 to 0.28), where the attention family stays stock."""
    _sdpa_order(monkeypatch, ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"))


@pytest.fixture(scope="session")
def _fp8_every_shape_table(tmp_path_factory) -> Path:
    import json
    path = tmp_path_factory.mktemp("fp8-shapes") / "every-shape.json"
    band = [{"max_k": 1 << 20, "rows": 0}]
    path.write_text(json.dumps({"measured": True, "evidence": {"file": "none", "key": "none"},
                                "min_rows": {"per_call": band, "cached": band}}))
    return path


@pytest.fixture(autouse=True)
def fp8_at_every_shape(_fp8_every_shape_table):
    """The tests' models are tiny: with the shipped shape table every FP8 Linear would decline for its few rows
    (fused_dit.integration.fp8_shapes). Each test starts with a table where FP8 runs at every shape; the tests of
    the rule install their own."""
    from fused_dit.integration import fp8_shapes
    fp8_shapes.use_table(_fp8_every_shape_table)
    yield
    fp8_shapes.use_table(_fp8_every_shape_table)
