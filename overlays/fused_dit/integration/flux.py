"""Overlay forwards for ComfyUI's Flux blocks (comfy/ldm/flux/layers.py: DoubleStreamBlock, SingleStreamBlock).

The math follows ComfyUI's blocks step by step; each enabled op family replaces one step:
- adaln:     apply_mod(LayerNorm(x), 1 + scale, shift) = addcmul(shift, LN(x), 1 + scale) -> adaln(x, shift, scale)
- norm_rope: per-head QK RMSNorm (0.3.x: ComfyUI's RMSNorm, weight `scale`, eps 1e-6; a torch `nn.RMSNorm` as
             `operations.RMSNorm` builds since 0.14: weight `weight`, eps None = finfo(dtype).eps, as torch takes it)
             and the interleaved RoPE that ComfyUI's `attention`
             applies -> flux_rms_rope on each stream with its slice of `pe`, then `attention(..., pe=None)`
             (RoPE is per position, so slicing pe per stream and concatenating the results is exact)
- gate:      x + apply_mod(y, gate) = x + y * gate -> gate_add(x, y, gate, FLUX rounding), in place where stock
             writes in place (`txt += ...`, `x += ...`)
- fp8_linear: the blocks' Linear layers (not the modulation Linears) through ops.fp8_linear
Calls with `modulation_dims_*` (Kontext-style per-segment modulation) run the stock forward unchanged.
While torch.compile traces, a family that `compiled.UNDER_COMPILE` leaves to Inductor takes its stock step.
"""
from __future__ import annotations

import torch

from ..ops import adaln, gate_add, rms_rope
from . import compiled, eras
from .blocks import BlockSpec, defining_module_global

DOUBLE = "DoubleStreamBlock"
SINGLE = "SingleStreamBlock"
DOUBLE_PARAMETERS = ("img", "txt", "vec", "pe", "attn_mask", "modulation_dims_img", "modulation_dims_txt",
                     "transformer_options")
SINGLE_PARAMETERS = ("x", "vec", "pe", "attn_mask", "modulation_dims", "transformer_options")


def _modulate(norm: torch.nn.Module, x: torch.Tensor, mod, ops) -> torch.Tensor:
    if compiled.fused("adaln", ops) and getattr(norm, "weight", None) is None:
        return adaln.adaln(x, mod.shift, mod.scale, eps=norm.eps)
    return torch.addcmul(mod.shift, norm(x), 1 + mod.scale)


def _gated(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, ops, in_place: bool) -> torch.Tensor:
    if compiled.fused("gate", ops):
        return gate_add.gate_add(x, y, gate, rounding=gate_add.FLUX, inplace=in_place)
    if in_place:
        x += y * gate
        return x
    return x + y * gate


def qk_norm_parameters(norm: torch.nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, float] | None:
    """(weight, eps) of one QK RMSNorm as its forward uses them, or None where the fused kernel cannot stand in
    for it (ComfyUI casts or patches the weight per call: low VRAM, LoRA on the fly)."""
    if getattr(norm, "comfy_cast_weights", False) or getattr(norm, "weight_function", None) \
            or getattr(norm, "bias_function", None):
        return None
    if isinstance(norm, torch.nn.RMSNorm):
        if norm.weight is None:
            return None
        return norm.weight, (torch.finfo(dtype).eps if norm.eps is None else norm.eps)
    scale = getattr(norm, "scale", None)
    return (scale, 1e-6) if isinstance(scale, torch.Tensor) else None


def _fused_qk_norm(qk_norm: torch.nn.Module, dtype: torch.dtype):
    """((q weight, k weight), eps) of a QKNorm for flux_rms_rope, or None: run the stock norm."""
    q_params = qk_norm_parameters(qk_norm.query_norm, dtype)
    k_params = qk_norm_parameters(qk_norm.key_norm, dtype)
    if q_params is None or k_params is None or q_params[1] != k_params[1]:
        return None
    return (q_params[0], k_params[0]), q_params[1]


def _split_heads(qkv: torch.Tensor, num_heads: int):
    return qkv.view(qkv.shape[0], qkv.shape[1], 3, num_heads, -1).permute(2, 0, 3, 1, 4)


def _pe_slice(pe: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return pe[:, :, start:stop].contiguous()


def double_block_forward(block, ops, stock, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None,
                         modulation_dims_txt=None, transformer_options={}):
    if modulation_dims_img is not None or modulation_dims_txt is not None or pe is None:
        return stock(img, txt, vec, pe, attn_mask=attn_mask, modulation_dims_img=modulation_dims_img,
                     modulation_dims_txt=modulation_dims_txt, transformer_options=transformer_options)
    attention = defining_module_global(block, DOUBLE, "attention")
    img_mod1, img_mod2 = block.img_mod(vec)
    txt_mod1, txt_mod2 = block.txt_mod(vec)

    img_q, img_k, img_v = _split_heads(block.img_attn.qkv(_modulate(block.img_norm1, img, img_mod1, ops)),
                                       block.num_heads)
    txt_q, txt_k, txt_v = _split_heads(block.txt_attn.qkv(_modulate(block.txt_norm1, txt, txt_mod1, ops)),
                                       block.num_heads)
    txt_len, img_len = txt.shape[1], img.shape[1]
    flipped = getattr(block, "flipped_img_txt", False)
    img_norm = _fused_qk_norm(block.img_attn.norm, img_q.dtype) if compiled.fused("norm_rope", ops) else None
    txt_norm = _fused_qk_norm(block.txt_attn.norm, txt_q.dtype) if img_norm else None
    if img_norm and txt_norm:
        img_start, txt_start = (0, img_len) if flipped else (txt_len, 0)
        img_pe = _pe_slice(pe, img_start, img_start + img_len)
        txt_pe = _pe_slice(pe, txt_start, txt_start + txt_len)
        img_q, img_k = rms_rope.flux_rms_rope(img_q, img_k, *img_norm[0], img_pe, eps=img_norm[1])
        txt_q, txt_k = rms_rope.flux_rms_rope(txt_q, txt_k, *txt_norm[0], txt_pe, eps=txt_norm[1])
        img_q, img_k, txt_q, txt_k = (t.to(img_v) for t in (img_q, img_k, txt_q, txt_k))
        attention_pe = None
    else:
        img_q, img_k = block.img_attn.norm(img_q, img_k, img_v)
        txt_q, txt_k = block.txt_attn.norm(txt_q, txt_k, txt_v)
        attention_pe = pe

    if flipped:
        attn = attention(torch.cat((img_q, txt_q), dim=2), torch.cat((img_k, txt_k), dim=2),
                         torch.cat((img_v, txt_v), dim=2), pe=attention_pe, mask=attn_mask,
                         transformer_options=transformer_options)
        img_attn, txt_attn = attn[:, :img_len], attn[:, img_len:]
    else:
        attn = attention(torch.cat((txt_q, img_q), dim=2), torch.cat((txt_k, img_k), dim=2),
                         torch.cat((txt_v, img_v), dim=2), pe=attention_pe, mask=attn_mask,
                         transformer_options=transformer_options)
        txt_attn, img_attn = attn[:, :txt_len], attn[:, txt_len:]

    img = _gated(img, block.img_attn.proj(img_attn), img_mod1.gate, ops, in_place=False)
    img = _gated(img, block.img_mlp(_modulate(block.img_norm2, img, img_mod2, ops)), img_mod2.gate, ops,
                 in_place=False)
    txt = _gated(txt, block.txt_attn.proj(txt_attn), txt_mod1.gate, ops, in_place=True)
    txt = _gated(txt, block.txt_mlp(_modulate(block.txt_norm2, txt, txt_mod2, ops)), txt_mod2.gate, ops,
                 in_place=True)
    if txt.dtype == torch.float16:
        txt = torch.nan_to_num(txt, nan=0.0, posinf=65504, neginf=-65504)
    return img, txt


def single_block_forward(block, ops, stock, x, vec, pe, attn_mask=None, modulation_dims=None,
                         transformer_options={}):
    if modulation_dims is not None or pe is None:
        return stock(x, vec, pe, attn_mask=attn_mask, modulation_dims=modulation_dims,
                     transformer_options=transformer_options)
    attention = defining_module_global(block, SINGLE, "attention")
    mod, _ = block.modulation(vec)
    qkv, mlp = torch.split(block.linear1(_modulate(block.pre_norm, x, mod, ops)),
                           [3 * block.hidden_size, block.mlp_hidden_dim], dim=-1)
    q, k, v = _split_heads(qkv, block.num_heads)
    norm = _fused_qk_norm(block.norm, q.dtype) if compiled.fused("norm_rope", ops) else None
    if norm:
        q, k = rms_rope.flux_rms_rope(q, k, *norm[0], pe, eps=norm[1])
        q, k = q.to(v), k.to(v)
        attn = attention(q, k, v, pe=None, mask=attn_mask, transformer_options=transformer_options)
    else:
        q, k = block.norm(q, k, v)
        attn = attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options)
    output = block.linear2(torch.cat((attn, block.mlp_act(mlp)), 2))
    x = _gated(x, output, mod.gate, ops, in_place=True)
    if x.dtype == torch.float16:
        x = torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504)
    return x


VARIANT = "flux_block_forward_0.3"
BLOCKS = (BlockSpec(DOUBLE, DOUBLE_PARAMETERS, double_block_forward, ("img_mod", "txt_mod"), VARIANT,
                    eras.flux_dependencies),
          BlockSpec(SINGLE, SINGLE_PARAMETERS, single_block_forward, ("modulation",), VARIANT,
                    eras.flux_dependencies))
