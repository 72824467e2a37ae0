"""Which backend runs an op, and why, said once per (op, backend, reason) in one line of the pack's once-only log.

Every op has an eager reference that always works; the Triton path is taken only when it can run:
CUDA tensors with Triton importable (or CPU tensors under TRITON_INTERPRET=1), and for FP8 ops a GPU of
compute capability >= 8.9. `FUSED_DIT_BACKEND=eager` forces eager everywhere (for A/B checks).
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

import torch

from . import state

BACKEND_LINE = "fused_dit: %s -> %s (%s)"
# the (op, backend, reason) tuples said so far, a view of the once-only log (scripts clear it between cases)
_said = state.SaidLines(BACKEND_LINE)


@dataclass(frozen=True)
class Choice:
    backend: str   # "triton" | "eager"
    reason: str

    @property
    def triton(self) -> bool:
        return self.backend == "triton"


@functools.lru_cache(maxsize=1)
def triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"triton is not importable ({type(exc).__name__}: {exc})"
    return None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def choose(op: str, *tensors: torch.Tensor, min_capability: tuple[int, int] | None = None) -> Choice:
    """Pick the backend for one call of `op` on these tensors and log the reason the first time, at DEBUG (the node's
    one INFO line per model says what runs; which backend a call takes is a detail)."""
    choice = _decide(tensors, min_capability)
    state.say_once(BACKEND_LINE, op, choice.backend, choice.reason, level=logging.DEBUG)
    return choice


def say_once(op: str, backend: str, reason: str) -> None:
    """Log a decision that is not a backend choice (e.g. an FP8 linear declining a module) once per reason: where a
    family the user turned on stays stock, INFO says why."""
    state.say_once(BACKEND_LINE, op, backend, reason)


def _decide(tensors: tuple[torch.Tensor, ...], min_capability: tuple[int, int] | None) -> Choice:
    if os.environ.get("FUSED_DIT_BACKEND") == "eager":
        return Choice("eager", "FUSED_DIT_BACKEND=eager")
    error = triton_import_error()
    if error:
        return Choice("eager", error)
    devices = {t.device.type for t in tensors}
    if devices == {"cuda"}:
        if min_capability is not None:
            cap = torch.cuda.get_device_capability(tensors[0].device)
            if cap < min_capability:
                want = ".".join(map(str, min_capability))
                return Choice("eager", f"sm_{cap[0]}{cap[1]} is below sm_{want.replace('.', '')} needed for FP8")
        return Choice("triton", "CUDA tensors and triton available")
    if devices == {"cpu"}:
        if interpreting():
            if min_capability is not None:
                return Choice("eager", "FP8 kernels are not checked under the Triton interpreter on CPU")
            return Choice("triton", "TRITON_INTERPRET=1 on CPU")
        return Choice("eager", "CPU tensors (no CUDA; set TRITON_INTERPRET=1 to run the Triton kernel on CPU)")
    return Choice("eager", f"tensors on {sorted(devices)}")
