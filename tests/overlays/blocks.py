"""Block fixtures for A/B tests and benchmarks: Flux double/single blocks and a Wan attention block.

Written for this project to follow ComfyUI's math step by step (comfy/ldm/flux/layers.py, comfy/ldm/flux/math.py,
comfy/ldm/wan/model.py as of 2025-10): same class names, attribute names and forward signatures, so
`fused_dit.enable` recognises them exactly as it recognises ComfyUI's classes. What differs from ComfyUI: layers
are plain torch modules (no comfy.ops casting, no weight_function), attention is torch SDPA, and the
module-level helpers the overlays look up (`attention`, `optimized_attention`, `repeat_e`) are defined here.

`make_flux_stack` / `make_wan_stack` build a small model in the state a ComfyUI release leaves its diffusion model in
(`comfy_state`: "0.3.64", training mode with parameters requiring grad, as ComfyUI 0.3.64 and earlier leave Flux and
Wan; "newer", `.eval().requires_grad_(False)` as newer BaseModel.__init__ does); `run(model, inputs, ops)` runs it
under torch.inference_mode() as ComfyUI's executor does, stock (ops=None) or with the overlays enabled, restoring
the stock forwards afterwards.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# ---------------------------------------------------------------------------------------------- shared helpers
def optimized_attention(q, k, v, heads, skip_reshape=False, mask=None, transformer_options={}):
    """ComfyUI's contract: [B, L, H*D] in (or [B, H, L, D] with skip_reshape), [B, L, H*D] out."""
    if not skip_reshape:
        b, _, c = q.shape
        q, k, v = (t.view(b, -1, heads, c // heads).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, h, n, d = out.shape
    return out.transpose(1, 2).reshape(b, n, h * d)


def apply_rope1(x, freqs_cis):
    pairs = x.to(dtype=freqs_cis.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 0] * pairs[..., 0]
    out.addcmul_(freqs_cis[..., 1], pairs[..., 1])
    return out.reshape(*x.shape).type_as(x)


def attention(q, k, v, pe, mask=None, transformer_options={}):
    """Flux attention: interleaved RoPE in fp32 on BHND q, k (when pe is given), then attention."""
    if pe is not None:
        q_shape, k_shape = q.shape, k.shape
        q = q.to(dtype=pe.dtype).reshape(*q.shape[:-1], -1, 1, 2)
        k = k.to(dtype=pe.dtype).reshape(*k.shape[:-1], -1, 1, 2)
        q = (pe[..., 0] * q[..., 0] + pe[..., 1] * q[..., 1]).reshape(*q_shape).type_as(v)
        k = (pe[..., 0] * k[..., 0] + pe[..., 1] * k[..., 1]).reshape(*k_shape).type_as(v)
    return optimized_attention(q, k, v, q.shape[1], skip_reshape=True, mask=mask,
                               transformer_options=transformer_options)


def rope_table(positions: torch.Tensor, dim: int, theta: float = 10000.0) -> torch.Tensor:
    """[..., N] positions -> [..., N, dim/2, 2, 2] rows [[cos, -sin], [sin, cos]] in fp32."""
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    omega = 1.0 / (theta ** exponent)
    angles = positions.double()[..., None] * omega
    cos, sin = torch.cos(angles), torch.sin(angles)
    return torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*angles.shape, 2, 2).float()


def rms_norm(x, weight, eps):
    return F.rms_norm(x, weight.shape, weight=weight.to(x.dtype), eps=eps)


# ---------------------------------------------------------------------------------------------- Flux
class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.scale, 1e-6)


class QKNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)

    def forward(self, q, k, v):
        return self.query_norm(q).to(v), self.key_norm(k).to(v)


class SelfAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.norm = QKNorm(dim // num_heads)
        self.proj = nn.Linear(dim, dim)


@dataclass
class ModulationOut:
    shift: torch.Tensor
    scale: torch.Tensor
    gate: torch.Tensor


class Modulation(nn.Module):
    def __init__(self, dim, double):
        super().__init__()
        self.is_double = double
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim, bias=True)

    def forward(self, vec):
        if vec.ndim == 2:
            vec = vec[:, None, :]
        out = self.lin(F.silu(vec)).chunk(self.multiplier, dim=-1)
        return ModulationOut(*out[:3]), (ModulationOut(*out[3:]) if self.is_double else None)


def apply_mod(tensor, m_mult, m_add=None, modulation_dims=None):
    if modulation_dims is not None:
        raise NotImplementedError("the fixtures do not model per-segment modulation")
    return torch.addcmul(m_add, tensor, m_mult) if m_add is not None else tensor * m_mult


def _layer_norm(hidden):
    return nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)


def _mlp(hidden, mlp_hidden):
    return nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.GELU(approximate="tanh"), nn.Linear(mlp_hidden, hidden))


class DoubleStreamBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, flipped_img_txt=False):
        super().__init__()
        mlp_hidden = int(hidden_size * mlp_ratio)
        self.num_heads = num_heads
        self.hidden_size = hidden_size
        self.img_mod = Modulation(hidden_size, double=True)
        self.img_norm1 = _layer_norm(hidden_size)
        self.img_attn = SelfAttention(hidden_size, num_heads)
        self.img_norm2 = _layer_norm(hidden_size)
        self.img_mlp = _mlp(hidden_size, mlp_hidden)
        self.txt_mod = Modulation(hidden_size, double=True)
        self.txt_norm1 = _layer_norm(hidden_size)
        self.txt_attn = SelfAttention(hidden_size, num_heads)
        self.txt_norm2 = _layer_norm(hidden_size)
        self.txt_mlp = _mlp(hidden_size, mlp_hidden)
        self.flipped_img_txt = flipped_img_txt

    def forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None, modulation_dims_txt=None,
                transformer_options={}):
        img_mod1, img_mod2 = self.img_mod(vec)
        txt_mod1, txt_mod2 = self.txt_mod(vec)
        img_in = apply_mod(self.img_norm1(img), 1 + img_mod1.scale, img_mod1.shift, modulation_dims_img)
        img_qkv = self.img_attn.qkv(img_in)
        img_q, img_k, img_v = img_qkv.view(img_qkv.shape[0], img_qkv.shape[1], 3, self.num_heads, -1
                                           ).permute(2, 0, 3, 1, 4)
        img_q, img_k = self.img_attn.norm(img_q, img_k, img_v)
        txt_in = apply_mod(self.txt_norm1(txt), 1 + txt_mod1.scale, txt_mod1.shift, modulation_dims_txt)
        txt_qkv = self.txt_attn.qkv(txt_in)
        txt_q, txt_k, txt_v = txt_qkv.view(txt_qkv.shape[0], txt_qkv.shape[1], 3, self.num_heads, -1
                                           ).permute(2, 0, 3, 1, 4)
        txt_q, txt_k = self.txt_attn.norm(txt_q, txt_k, txt_v)
        if self.flipped_img_txt:
            attn = attention(torch.cat((img_q, txt_q), 2), torch.cat((img_k, txt_k), 2),
                             torch.cat((img_v, txt_v), 2), pe=pe, mask=attn_mask)
            img_attn, txt_attn = attn[:, :img.shape[1]], attn[:, img.shape[1]:]
        else:
            attn = attention(torch.cat((txt_q, img_q), 2), torch.cat((txt_k, img_k), 2),
                             torch.cat((txt_v, img_v), 2), pe=pe, mask=attn_mask)
            txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]
        img = img + apply_mod(self.img_attn.proj(img_attn), img_mod1.gate)
        img = img + apply_mod(self.img_mlp(apply_mod(self.img_norm2(img), 1 + img_mod2.scale, img_mod2.shift)),
                              img_mod2.gate)
        txt += apply_mod(self.txt_attn.proj(txt_attn), txt_mod1.gate)
        txt += apply_mod(self.txt_mlp(apply_mod(self.txt_norm2(txt), 1 + txt_mod2.scale, txt_mod2.shift)),
                         txt_mod2.gate)
        if txt.dtype == torch.float16:
            txt = torch.nan_to_num(txt, nan=0.0, posinf=65504, neginf=-65504)
        return img, txt


class SingleStreamBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.hidden_dim = hidden_size
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.linear1 = nn.Linear(hidden_size, hidden_size * 3 + self.mlp_hidden_dim)
        self.linear2 = nn.Linear(hidden_size + self.mlp_hidden_dim, hidden_size)
        self.norm = QKNorm(hidden_size // num_heads)
        self.pre_norm = _layer_norm(hidden_size)
        self.mlp_act = nn.GELU(approximate="tanh")
        self.modulation = Modulation(hidden_size, double=False)

    def forward(self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={}):
        mod, _ = self.modulation(vec)
        qkv, mlp = torch.split(self.linear1(apply_mod(self.pre_norm(x), 1 + mod.scale, mod.shift, modulation_dims)),
                               [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
        q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.norm(q, k, v)
        attn = attention(q, k, v, pe=pe, mask=attn_mask)
        output = self.linear2(torch.cat((attn, self.mlp_act(mlp)), 2))
        x += apply_mod(output, mod.gate)
        if x.dtype == torch.float16:
            x = torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504)
        return x


class Flux(nn.Module):
    """A stack of double then single blocks, called the way ComfyUI's Flux.forward_orig calls them."""

    def __init__(self, hidden_size, num_heads, depth, depth_single):
        super().__init__()
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(hidden_size, num_heads) for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(hidden_size, num_heads) for _ in range(depth_single))

    def forward(self, img, txt, vec, pe):
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=None)
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = block(x, vec=vec, pe=pe, attn_mask=None)
        return x[:, txt.shape[1]:]


# ---------------------------------------------------------------------------------------------- Wan
class WanRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class WanSelfAttention(nn.Module):
    def __init__(self, dim, num_heads, eps=1e-6):
        super().__init__()
        self.dim, self.num_heads, self.head_dim, self.eps = dim, num_heads, dim // num_heads, eps
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = WanRMSNorm(dim, eps)
        self.norm_k = WanRMSNorm(dim, eps)

    def forward(self, x, freqs, transformer_options={}):
        b, s, n, d = *x.shape[:2], self.num_heads, self.head_dim
        q = apply_rope1(self.norm_q(self.q(x)).view(b, s, n, d), freqs)
        k = apply_rope1(self.norm_k(self.k(x)).view(b, s, n, d), freqs)
        x = optimized_attention(q.view(b, s, n * d), k.view(b, s, n * d), self.v(x).view(b, s, n * d),
                                heads=self.num_heads)
        return self.o(x)


class WanT2VCrossAttention(WanSelfAttention):
    def forward(self, x, context, transformer_options={}, **kwargs):
        q = self.norm_q(self.q(x))
        k = self.norm_k(self.k(context))
        return self.o(optimized_attention(q, k, self.v(context), heads=self.num_heads))


def repeat_e(e, x):
    repeats = x.size(1) // e.size(1) if e.size(1) > 1 else 1
    if repeats == 1:
        return e
    if repeats * e.size(1) == x.size(1):
        return torch.repeat_interleave(e, repeats, dim=1)
    return torch.repeat_interleave(e, repeats + 1, dim=1)[:, :x.size(1)]


class WanAttentionBlock(nn.Module):
    def __init__(self, dim, ffn_dim, num_heads, eps=1e-6):
        super().__init__()
        self.dim, self.num_heads, self.eps = dim, num_heads, eps
        self.norm1 = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.self_attn = WanSelfAttention(dim, num_heads, eps)
        self.norm3 = nn.Identity()
        self.cross_attn = WanT2VCrossAttention(dim, num_heads, eps)
        self.norm2 = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

    def forward(self, x, e, freqs, context, context_img_len=257, transformer_options={}):
        modulation = self.modulation.to(dtype=x.dtype, device=x.device)
        e = (modulation + e).chunk(6, dim=1) if e.ndim < 4 else (modulation.unsqueeze(0) + e).unbind(2)
        y = self.self_attn(torch.addcmul(repeat_e(e[0], x), self.norm1(x), 1 + repeat_e(e[1], x)), freqs)
        x = torch.addcmul(x, y, repeat_e(e[2], x))
        x = x + self.cross_attn(self.norm3(x), context, context_img_len=context_img_len)
        y = self.ffn(torch.addcmul(repeat_e(e[3], x), self.norm2(x), 1 + repeat_e(e[4], x)))
        return torch.addcmul(x, y, repeat_e(e[5], x))


class WanModel(nn.Module):
    def __init__(self, dim, ffn_dim, num_heads, depth):
        super().__init__()
        self.blocks = nn.ModuleList(WanAttentionBlock(dim, ffn_dim, num_heads) for _ in range(depth))

    def forward(self, x, e, freqs, context):
        for block in self.blocks:
            x = block(x, e=e, freqs=freqs, context=context, context_img_len=0)
        return x


# ---------------------------------------------------------------------------------------------- builders
def _randomise(model: nn.Module, generator: torch.Generator) -> None:
    """Weights with unit-ish activations (default init leaves norm weights at one; vary them too)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[-1] if p.ndim > 1 else 1
            values = torch.randn(p.shape, generator=generator, device=p.device)
            if p.ndim > 1:
                p.copy_(values / fan_in ** 0.5)
            elif name.endswith(("scale", "norm_q.weight", "norm_k.weight")):
                p.copy_(1 + 0.1 * values)
            else:
                p.copy_(0.02 * values)


COMFY_STATES = ("0.3.64", "newer")


def as_comfy_leaves_it(model: nn.Module, comfy_state: str) -> nn.Module:
    """The model in the mode and requires_grad state a ComfyUI release leaves its diffusion model in."""
    if comfy_state == "0.3.64":
        return model.train().requires_grad_(True)
    if comfy_state == "newer":
        return model.eval().requires_grad_(False)
    raise ValueError(f"comfy_state={comfy_state!r}; expected one of {COMFY_STATES}")


def _random_model(build, dtype, device, seed, comfy_state):
    """(model built on device with seeded random weights, in dtype and the state `comfy_state` names; the
    generator, for its inputs)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        model = build()
    _randomise(model, generator)
    return as_comfy_leaves_it(model.to(dtype=dtype), comfy_state), generator


def make_flux_stack(hidden=64, heads=4, depth=1, depth_single=1, batch=2, img_len=24, txt_len=8,
                    dtype=torch.float32, device="cpu", seed=0, comfy_state="0.3.64"):
    model, generator = _random_model(lambda: Flux(hidden, heads, depth, depth_single), dtype, device, seed,
                                     comfy_state)
    head_dim = hidden // heads
    positions = torch.arange(txt_len + img_len, dtype=torch.float32)
    pe = rope_table(positions, head_dim).reshape(1, 1, txt_len + img_len, head_dim // 2, 2, 2)
    inputs = dict(
        img=torch.randn(batch, img_len, hidden, generator=generator, device=device),
        txt=torch.randn(batch, txt_len, hidden, generator=generator, device=device),
        vec=torch.randn(batch, hidden, generator=generator, device=device),
        pe=pe.expand(batch, -1, -1, -1, -1, -1).contiguous())
    inputs = {k: (v.to(device) if k == "pe" else v.to(device=device, dtype=dtype)) for k, v in inputs.items()}
    return model, inputs


def make_wan_stack(dim=64, heads=4, ffn_dim=128, depth=1, batch=2, length=24, context_len=8,
                   dtype=torch.float32, device="cpu", seed=0, comfy_state="0.3.64"):
    model, generator = _random_model(lambda: WanModel(dim, ffn_dim, heads, depth), dtype, device, seed, comfy_state)
    head_dim = dim // heads
    freqs = rope_table(torch.arange(length, dtype=torch.float32), head_dim).reshape(1, length, 1, head_dim // 2, 2, 2)
    inputs = dict(
        x=torch.randn(batch, length, dim, generator=generator, device=device).to(dtype),
        e=(0.1 * torch.randn(batch, 6, dim, generator=generator, device=device)).to(dtype),
        freqs=freqs.to(device),
        context=torch.randn(batch, context_len, dim, generator=generator, device=device).to(dtype))
    return model, inputs


def run(model: nn.Module, inputs: dict, ops=None) -> torch.Tensor:
    """Stock forward (ops=None) or with `fused_dit.enable(model, ops)`, under torch.inference_mode() as ComfyUI's
    executor runs a prompt; inputs are cloned (blocks write in place)."""
    import fused_dit

    fresh = {k: v.clone() for k, v in inputs.items()}
    if ops is None:
        with torch.inference_mode():
            return model(**fresh)
    fused_dit.enable(model, ops=ops)
    try:
        with torch.inference_mode():
            return model(**fresh)
    finally:
        fused_dit.disable(model)


def copy_model(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
