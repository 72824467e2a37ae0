"""Fused DiT operators: one module per op, each with its Triton kernel, launch wrapper and eager references.

- rms_rope:  per-head RMSNorm + interleaved RoPE on q and k (Flux, BHND) and full-C RMSNorm + RoPE (Wan, BNHD)
- adaln:     addcmul(shift, LayerNorm(x), 1 + scale) with per-sample / per-token / grouped modulation rows
- gate_add:  the residual gate, Wan's addcmul(x, y, gate) and Flux's x + gate * y

Every public op falls back to its `reference_comfy` (the eager chain ComfyUI runs) when `dispatch.choose` says
the Triton kernel cannot run. This package imports no Triton; each op module imports it lazily-guarded.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import state


def modulation_group(rows: int, tokens: int) -> int:
    """Tokens per modulation row under ComfyUI's Wan `repeat_e` (row = token // group).

    repeat_e keeps one row as a broadcast, repeats each of `rows` rows `tokens // rows` times when that divides
    evenly, and otherwise repeats `tokens // rows + 1` times and cuts the tail, so the group is not always
    `tokens // rows`.
    """
    if rows <= 1:
        return max(tokens, 1)
    repeats = tokens // rows
    if repeats == 1:
        if rows != tokens:   # repeat_e leaves such rows unexpanded and the eager broadcast fails
            raise ValueError(f"{rows} modulation rows do not broadcast over {tokens} tokens")
        return 1
    return repeats if repeats * rows == tokens else repeats + 1


def repeat_rows_like_comfy(modulation: torch.Tensor, tokens: int) -> torch.Tensor:
    """The eager expansion ComfyUI's Wan blocks apply to a `[B, rows, C]` modulation (semantics of repeat_e)."""
    rows = modulation.size(1)
    repeats = tokens // rows if rows > 1 else 1
    if repeats == 1:
        return modulation
    if repeats * rows == tokens:
        return torch.repeat_interleave(modulation, repeats, dim=1)
    return torch.repeat_interleave(modulation, repeats + 1, dim=1)[:, :tokens]


def as_batch_rows_channels(modulation: torch.Tensor, batch: int, channels: int, what: str) -> torch.Tensor:
    """View a modulation tensor (`[C]`, `[B, C]`, `[B|1, rows, C]`) as 3-D `[B|1, rows, C]` without copying."""
    if modulation.dim() == 1:
        modulation = modulation.view(1, 1, -1)
    elif modulation.dim() == 2:
        modulation = modulation.unsqueeze(1)
    if modulation.dim() != 3 or modulation.size(-1) != channels or modulation.size(0) not in (1, batch):
        raise ValueError(f"{what}: expected [B|1, rows, {channels}] for batch {batch}, got {tuple(modulation.shape)}")
    return modulation


def batch_stride(tensor: torch.Tensor) -> int:
    """Stride of dim 0, or 0 where that dim broadcasts (size 1), so a kernel indexes every sample correctly."""
    return 0 if tensor.size(0) == 1 else tensor.stride(0)


KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

EAGER_FALLBACK_LINE = "fused_dit: %s -> eager (%s)"
# the (op, reason) pairs said so far, a view of the once-only log (parity and scripts clear it between cases)
_fallbacks_said = state.SaidLines(EAGER_FALLBACK_LINE)


def eager_because(op: str, reason: str) -> None:
    """Say once per (op, reason) that a call the dispatcher sent to Triton runs eager for a shape/dtype reason."""
    state.say_once(EAGER_FALLBACK_LINE, op, reason)


def into_out(result, out):
    """Copy an eager result into caller-provided output tensor(s) (a tensor or a tuple), or return it as is."""
    if out is None:
        return result
    if isinstance(out, torch.Tensor):
        return out.copy_(result.view(out.shape))
    return tuple(o.copy_(r.view(o.shape)) for o, r in zip(out, result))


def check_out(out: torch.Tensor, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Caller-provided outputs must be exactly what the kernel would allocate (contiguous, same dtype/device)."""
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(shape)} {dtype} tensor on {device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device} (contiguous={out.is_contiguous()})")
    return out


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids (plain Python: triton.cdiv costs host microseconds per call in some releases)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1), as triton.next_power_of_2, without its per-call overhead."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class TuningRecord:
    """Why an op's launch setting is what it is: one record per op, beside its setting. The timings are in the
    sweep's results, never here: `results` is a file of the repository's benchmarks/results/ (not shipped with the
    pack) and the key of this op's sweep in it."""
    chosen: str                  # the setting, in words
    runner_up: str               # the settings the sweep timed closest to it, in words
    date: str
    results: str                 # "FILE: key"
