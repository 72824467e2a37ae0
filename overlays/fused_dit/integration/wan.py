"""Overlay forward for ComfyUI's Wan block (comfy/ldm/wan/model.py: WanAttentionBlock, WanSelfAttention).

Follows ComfyUI's block step by step; each enabled op family replaces one step:
- adaln:     addcmul(repeat_e(e0), LayerNorm(x), 1 + repeat_e(e1)) -> adaln(x, shift, scale)  (norm1, norm2)
- norm_rope: self-attention's full-width RMSNorm of q and k (over all heads, weight `weight`) + view + RoPE
             (apply_rope1) -> wan_rms_rope; cross-attention (no RoPE) stays stock
- gate:      addcmul(x, y, repeat_e(e)) -> gate_add(x, y, gate, WAN rounding)
- fp8_linear: self/cross-attention and FFN Linears through ops.fp8_linear (GELU fused into the FFN's second GEMM)
The modulation is expanded with the model's own `repeat_e` (repeat_interleave, not `row // group`).
While torch.compile traces, a family that `compiled.UNDER_COMPILE` leaves to Inductor takes its stock step.
"""
from __future__ import annotations

import torch

from ..ops import adaln, gate_add, rms_rope
from . import compiled, eras
from .blocks import BlockSpec, defining_module_global

BLOCK = "WanAttentionBlock"
BLOCK_PARAMETERS = ("x", "e", "freqs", "context", "context_img_len", "transformer_options")


def _modulate(block, norm, x, shift, scale, ops):
    if compiled.fused("adaln", ops) and getattr(norm, "weight", None) is None:
        return adaln.adaln(x, shift, scale, eps=norm.eps)
    return torch.addcmul(shift, norm(x), 1 + scale)


def _gated(x, y, gate, ops):
    if compiled.fused("gate", ops):
        return gate_add.gate_add(x, y, gate, rounding=gate_add.WAN)
    return torch.addcmul(x, y, gate)


def _fusable_qk_norm(attn) -> bool:
    """Both norms hold a weight the kernel may read as it is (ComfyUI casting or patching it per call - low VRAM,
    LoRA on the fly - keeps the stock norms)."""
    norms = [getattr(attn, n, None) for n in ("norm_q", "norm_k")]
    return all(getattr(n, "weight", None) is not None and not getattr(n, "comfy_cast_weights", False)
               and not getattr(n, "weight_function", None) and not getattr(n, "bias_function", None) for n in norms)


def self_attention(block, attn, x, freqs, transformer_options, ops):
    if not compiled.fused("norm_rope", ops) or not _fusable_qk_norm(attn):
        return attn(x, freqs, transformer_options=transformer_options)
    optimized_attention = defining_module_global(block, BLOCK, "optimized_attention")
    b, s, n, d = *x.shape[:2], attn.num_heads, attn.head_dim
    eps = getattr(attn.norm_q, "eps", attn.eps)
    q, k = rms_rope.wan_rms_rope(attn.q(x), attn.k(x), attn.norm_q.weight, attn.norm_k.weight, freqs, n, eps=eps)
    out = optimized_attention(q.reshape(b, s, n * d), k.reshape(b, s, n * d), attn.v(x).view(b, s, n * d),
                              heads=n, transformer_options=transformer_options)
    return attn.o(out)


def block_forward(block, ops, stock, x, e, freqs, context, context_img_len=257, transformer_options={}):
    repeat_e = defining_module_global(block, BLOCK, "repeat_e")
    modulation = block.modulation.to(dtype=x.dtype, device=x.device)
    if e.ndim < 4:
        e = (modulation + e).chunk(6, dim=1)
    else:
        e = (modulation.unsqueeze(0) + e).unbind(2)
    y = self_attention(block, block.self_attn,
                       _modulate(block, block.norm1, x, repeat_e(e[0], x), repeat_e(e[1], x), ops),
                       freqs, transformer_options, ops)
    x = _gated(x, y, repeat_e(e[2], x), ops)
    del y
    x = x + block.cross_attn(block.norm3(x), context, context_img_len=context_img_len,
                             transformer_options=transformer_options)
    y = block.ffn(_modulate(block, block.norm2, x, repeat_e(e[3], x), repeat_e(e[4], x), ops))
    return _gated(x, y, repeat_e(e[5], x), ops)


VARIANT = "wan_block_forward_0.3"
BLOCKS = (BlockSpec(BLOCK, BLOCK_PARAMETERS, block_forward, ("modulation",), VARIANT, eras.wan_dependencies),)
