"""The attention family's `fp8` mode (issue 28): ComfyUI's attention call run by the pack's low-precision kernel
(ops/attention_fp8.py: 8-bit Q K^T, its formats there), opt-in, through the same seam as the exact mode
(`optimized_attention_override`).

ComfyUI's `wrap_attn` calls the override as `override(func, q, k, v, heads, mask=None, attn_precision=None,
skip_reshape=False, skip_output_reshape=False, **kwargs)`: q, k, v are `[B, S, heads * D]`, or `[B, heads, S, D]`
with skip_reshape; the output is `[B, Sq, heads * D]`, or `[B, heads, Sq, D]` with skip_output_reshape, as
ComfyUI's attention_pytorch returns it. The kernel takes the `[B, heads, S, D]` views as they are (any strides).

A call the kernel cannot take goes to the exact mode (`exact`: FastestSdpa where the registry runs it, else
ComfyUI's own function), and the reason is said once through the pack's once-only log: a mask, grouped-query
attention, a model that asks for full precision (`low_precision_attention=False`, as ComfyUI's sage binding
honours), a head dim, dtype, device or GPU the kernel does not cover (ops.attention_fp8.refusal).

Capture-safe (ComfyUI's model compiler captures blocks in CUDA graphs): the choice reads only shapes, dtypes,
devices and the GPU's capability; the kernel derives its scales on the GPU, syncs nothing with the host and
allocates alike on every call of a shape. Under torch.compile (TorchCompileModel) an accepted call is traced as
one custom op (`torch.ops.fused_dit.attention_fp8`, which falls back to SDPA itself where the GPU refuses); a
refused one is ComfyUI's own call, traced as it is, with nothing said while tracing.
"""
from __future__ import annotations

import torch

from .. import state
from ..ops import attention_fp8 as kernel

FALLBACK_LINE = "Fused DiT Ops: attention fp8 -> exact for %s"
RUNS = ("low-precision attention (INT8 Q K^T, P V in the model's dtype, fp32 accumulation, scales on the GPU); "
        "exact where a call is refused")


def call_refusal(q, k, v, heads, mask, skip_reshape: bool, kwargs: dict) -> str | None:
    """Why this attention call stays exact, from its arguments alone (None: the kernel's own checks next)."""
    if mask is not None:
        return "calls with a mask"
    if kwargs.get("low_precision_attention", True) is False:
        return "calls whose model asks for full precision (low_precision_attention=False)"
    if kwargs.get("enable_gqa", False):
        return "grouped-query attention (enable_gqa)"
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "calls whose q, k, v are not tensors"
    want = 4 if skip_reshape else 3
    if q.dim() != want or k.dim() != want or v.dim() != want:
        return f"q, k, v that are not {want}-D ({'skip_reshape' if skip_reshape else '[B, S, heads * D]'})"
    if not skip_reshape and (not isinstance(heads, int) or heads <= 0 or q.shape[-1] % heads
                             or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]):
        return f"q, k, v whose last dims do not split into {heads} heads alike"
    return None


def to_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """`[B, S, heads * D]` -> the `[B, heads, S, D]` view (ComfyUI's reshape and transpose, no copy)."""
    b, s, hd = t.shape
    return t.reshape(b, s, heads, hd // heads).transpose(1, 2)


class Fp8Attention:
    """An `optimized_attention_override` running ComfyUI's attention calls in FP8 (see the module)."""

    def __init__(self, exact=None):
        self.exact = exact          # the exact mode's override for refused calls; None: ComfyUI's own function

    def __call__(self, func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                 skip_output_reshape=False, **kwargs):
        why = call_refusal(q, k, v, heads, mask, skip_reshape, kwargs)
        if why is None:
            q4, k4, v4 = (q, k, v) if skip_reshape else (to_heads(t, heads) for t in (q, k, v))
            why = None if torch.compiler.is_compiling() else kernel.refusal(q4, k4, v4)
        if why is not None:
            return self._exact(why, func, q, k, v, heads, mask=mask, attn_precision=attn_precision,
                               skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape, **kwargs)
        out = kernel.attention_fp8(q4, k4, v4, kwargs.get("scale"))         # [B, heads, Sq, D]
        if skip_output_reshape:
            return out
        b, h, sq, d = out.shape
        return out.transpose(1, 2).reshape(b, sq, h * d)

    def _exact(self, why: str, func, *args, **kwargs):
        if not torch.compiler.is_compiling():
            state.say_once(FALLBACK_LINE, why)
        if self.exact is None or torch.compiler.is_compiling():
            return func(*args, **kwargs)
        return self.exact(func, *args, **kwargs)
