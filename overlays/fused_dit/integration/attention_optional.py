"""Attention kernels the user's environment may hold, never required (issue 38): SageAttention 2 and FlashAttention-4.

- SageAttention 2 (`sageattention` 2.x: INT8 Q K^T, FP8 P V on sm_89+), lossy: one more candidate of the `fp8` mode,
  called as ComfyUI's `--use-sage-attention` calls `sageattn` (HND layout, smooth_k=False, the model's scale); it is
  also the mode's yardstick, measured on the call itself (integration/attention_fp8.py).
- FlashAttention-4 (`flash_attn.cute`, the `flash-attn-4` package on NVIDIA's CUTLASS DSL), exact: one more candidate
  of the exact mode beside SDPA's backends (integration/attention.py), where its output stays within the exact
  mode's tolerance of the release's own.
Each is looked up on a shape's first (eager) call, timed there like the others, and where it is absent, too old or
refuses the call, it is no candidate and the reason is said once (logger `fused_dit`, at DEBUG). Nothing here
imports either package before that lookup.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import warnings

from .. import state

SAGE2, FA4 = "SageAttention 2", "FlashAttention-4"
ABSENT_LINE = "Fused DiT Ops: attention: %s is no candidate (%s)"
FA4_HEAD_DIMS = (64, 96, 128)        # flash_attn.cute's forward on sm_90 (bf16 / fp16)


def _version(module, distribution: str) -> str | None:
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(distribution)
        except Exception:
            return None
    return str(version)


def _absent(name: str, why: str) -> None:
    state.say_once(ABSENT_LINE, name, why, level=logging.DEBUG)


def sage2():
    """SageAttention 2's `sageattn`, or None (absent, or a 1.x release: said once)."""
    try:
        module = importlib.import_module("sageattention")
    except Exception as exc:
        _absent(SAGE2, f"sageattention does not import: {type(exc).__name__}")
        return None
    version = _version(module, "sageattention")
    major = version.split(".")[0] if version else None
    if major is None and hasattr(module, "sageattn_qk_int8_pv_fp8_cuda"):     # built in place, no metadata
        major = "2"
    if not (major and major.isdigit() and int(major) >= 2) or not callable(getattr(module, "sageattn", None)):
        _absent(SAGE2, f"sageattention {version or 'of unknown version'} is not SageAttention 2 or later")
        return None
    return module.sageattn


def sage2_call(sageattn, q4, k4, v4, scale):
    """SageAttention on `[B, heads, S, D]` views, as ComfyUI's attention_sage calls it; `[B, heads, Sq, D]` out."""
    return sageattn(q4, k4, v4, tensor_layout="HND", is_causal=False, sm_scale=scale, smooth_k=False)


def fa4():
    """FlashAttention-4's `flash_attn_func`, or None (absent: said once)."""
    try:
        module = importlib.import_module("flash_attn.cute")
        return module.flash_attn_func
    except Exception as exc:
        _absent(FA4, f"flash_attn.cute does not import: {type(exc).__name__}")
        return None


@contextlib.contextmanager
def quiet_compile():
    """FlashAttention-4 compiles a shape at its first call, and NVIDIA's CUTLASS DSL then warns, once per shape, of an
    argument it cannot pass ("aux_data ... cannot be converted to a JitArgument"): a UserWarning in the user's console
    about the package's own code. Silenced for the calls that compile and time a shape, nothing else."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"cutlass(\.|$)")
        yield


def fa4_refusal(q, k, v, heads, kwargs: dict) -> str | None:
    """Why FlashAttention-4 cannot take ComfyUI's attention_pytorch call as it stands (None: it can)."""
    if kwargs.get("mask") is not None or kwargs.get("enable_gqa", False):
        return "calls with a mask or grouped-query attention"
    if q.dtype != k.dtype or q.dtype != v.dtype or str(q.dtype) not in ("torch.bfloat16", "torch.float16"):
        return "q, k, v that are not one of bf16 / fp16"
    skip = kwargs.get("skip_reshape", False)
    d = q.shape[-1] if skip else (q.shape[-1] // heads if isinstance(heads, int) and heads > 0 else 0)
    if q.dim() != (4 if skip else 3) or d not in FA4_HEAD_DIMS or k.shape[-1] != q.shape[-1] \
            or v.shape[-1] != q.shape[-1] or (not skip and q.shape[-1] % heads):
        return f"head dims other than {', '.join(map(str, FA4_HEAD_DIMS))}"
    return None


def fa4_call(attend, q, k, v, heads, kwargs: dict):
    """ComfyUI's attention_pytorch call run by FlashAttention-4 (its `[B, S, heads, D]` layout), returned in the
    layout ComfyUI's function returns."""
    if kwargs.get("skip_reshape", False):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    else:
        q, k, v = (t.reshape(t.shape[0], t.shape[1], heads, -1) for t in (q, k, v))
    out = attend(q, k, v, softmax_scale=kwargs.get("scale"), causal=False)
    out = out[0] if isinstance(out, tuple) else out                       # (out, lse)
    if kwargs.get("skip_output_reshape", False):
        return out.transpose(1, 2)
    return out.reshape(out.shape[0], out.shape[1], -1)
