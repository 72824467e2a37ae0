"""ComfyUI-shaped fixtures of the 2026 eras (0.8 and later), written for this project after reading ComfyUI's shapes.

What they model, as ComfyUI's blocks have it since the comfy-kitchen era:
- RoPE goes through an op seam: the module-level `attention` calls `apply_rope`, which calls the comfy-kitchen
  namespace `comfy.quant_ops.ck.apply_rope` (here `CK`) at call time unless training, as 0.24+ does;
- Flux's QK norm holds torch `nn.RMSNorm` (parameter `weight`, eps None) as `operations.RMSNorm` builds since 0.14;
- Flux blocks run `transformer_options["patches"]["attn1_patch"]` on q, k, v before attention and
  `"attn1_output_patch"` on its output (how NAG-style nodes hook in), and take `modulation=False` (Flux.2: the
  modulation comes in through `vec`);
- Wan's block makes `x` contiguous first and runs its self-attention's `attn1_patch` on the attention output.
Class names and forward signatures are ComfyUI's, so `fused_dit.enable` recognises them as it would the real ones;
their code differs from the 0.3.64-shaped fixtures in blocks.py, so no verified variant matches and the node must
leave them stock. `FluxTorchNorm*` keep blocks.py's 0.3.64 forwards but hold torch RMSNorms (the crash of issue 20).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

import blocks
from blocks import ModulationOut, apply_mod, optimized_attention, repeat_e


def _apply_rope1(x, freqs_cis):
    """The eager RoPE of the comfy-kitchen era (ComfyUI's _apply_rope1, comfy-kitchen's eager backend)."""
    pairs = x.to(dtype=freqs_cis.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    if pairs.shape[2] != 1 and freqs_cis.shape[2] != 1 and pairs.shape[2] != freqs_cis.shape[2]:
        freqs_cis = freqs_cis[:, :, :pairs.shape[2]]
    out = freqs_cis[..., 0] * pairs[..., 0]
    out.addcmul_(freqs_cis[..., 1], pairs[..., 1])
    return out.reshape(*x.shape).type_as(x)


def _apply_rope(xq, xk, freqs_cis):
    return apply_rope1(xq, freqs_cis), apply_rope1(xk, freqs_cis)


# comfy.quant_ops.ck (comfy-kitchen) and comfy.model_management.in_training as the math module reaches them; a test
# may swap CK's members
CK = SimpleNamespace(apply_rope1=_apply_rope1, apply_rope=lambda xq, xk, freqs: (_apply_rope1(xq, freqs),
                                                                                  _apply_rope1(xk, freqs)))
comfy = SimpleNamespace(quant_ops=SimpleNamespace(ck=CK), model_management=SimpleNamespace(in_training=False))


def apply_rope(xq, xk, freqs_cis):
    if comfy.model_management.in_training:
        return _apply_rope(xq, xk, freqs_cis)
    return comfy.quant_ops.ck.apply_rope(xq, xk, freqs_cis)


def apply_rope1(x, freqs_cis):
    if comfy.model_management.in_training:
        return _apply_rope1(x, freqs_cis)
    return comfy.quant_ops.ck.apply_rope1(x, freqs_cis)


def attention(q, k, v, pe, mask=None, transformer_options={}):
    if pe is not None:
        q, k = apply_rope(q, k, pe)
    return optimized_attention(q, k, v, q.shape[1], skip_reshape=True, mask=mask,
                               transformer_options=transformer_options)


class QKNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.query_norm = nn.RMSNorm(dim)
        self.key_norm = nn.RMSNorm(dim)

    def forward(self, q, k, v):
        return self.query_norm(q).to(v), self.key_norm(k).to(v)


def _with_torch_norms(attention_module):
    attention_module.norm = QKNorm(attention_module.norm.query_norm.scale.shape[0])
    return attention_module


def _run_patches(name, transformer_options):
    return transformer_options.get("patches", {}).get(name, [])


def _pre_attention(q, k, v, pe, attn_mask, transformer_options, extra_options):
    """ComfyUI's attn1_patch loop of the 2026 Flux blocks: each patch may replace q, k, v or pe."""
    for p in _run_patches("attn1_patch", transformer_options):
        out = p(q, k, v, pe=pe, attn_mask=attn_mask, extra_options=extra_options)
        q, k, v, pe = out.get("q", q), out.get("k", k), out.get("v", v), out.get("pe", pe)
    return q, k, v, pe


class DoubleStreamBlock(blocks.DoubleStreamBlock):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, modulation=True):
        super().__init__(hidden_size, num_heads, mlp_ratio)
        self.modulation = modulation
        if not modulation:
            del self.img_mod, self.txt_mod
        _with_torch_norms(self.img_attn)
        _with_torch_norms(self.txt_attn)

    def forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None, modulation_dims_txt=None,
                transformer_options={}):
        if self.modulation:
            img_mod1, img_mod2 = self.img_mod(vec)
            txt_mod1, txt_mod2 = self.txt_mod(vec)
        else:
            (img_mod1, img_mod2), (txt_mod1, txt_mod2) = vec
        extra_options = transformer_options.copy()
        streams = []
        for x, mod, attn, norm in ((img, img_mod1, self.img_attn, self.img_norm1),
                                   (txt, txt_mod1, self.txt_attn, self.txt_norm1)):
            qkv = attn.qkv(apply_mod(norm(x), 1 + mod.scale, mod.shift))
            q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
            streams.append((*attn.norm(q, k, v), v))
        (img_q, img_k, img_v), (txt_q, txt_k, txt_v) = streams
        q, k, v = (torch.cat(pair, dim=2) for pair in ((txt_q, img_q), (txt_k, img_k), (txt_v, img_v)))
        extra_options["img_slice"] = [txt.shape[1], q.shape[2]]
        q, k, v, pe = _pre_attention(q, k, v, pe, attn_mask, transformer_options, extra_options)
        attn = attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options)
        for p in _run_patches("attn1_output_patch", transformer_options):
            attn = p(attn, extra_options)
        txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]
        img += apply_mod(self.img_attn.proj(img_attn), img_mod1.gate)
        img += apply_mod(self.img_mlp(apply_mod(self.img_norm2(img), 1 + img_mod2.scale, img_mod2.shift)),
                         img_mod2.gate)
        txt += apply_mod(self.txt_attn.proj(txt_attn), txt_mod1.gate)
        txt += apply_mod(self.txt_mlp(apply_mod(self.txt_norm2(txt), 1 + txt_mod2.scale, txt_mod2.shift)),
                         txt_mod2.gate)
        return img, txt


class SingleStreamBlock(blocks.SingleStreamBlock):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, modulation=True):
        super().__init__(hidden_size, num_heads, mlp_ratio)
        self.norm = QKNorm(hidden_size // num_heads)
        if not modulation:
            self.modulation = None

    def forward(self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={}):
        mod = self.modulation(vec)[0] if self.modulation else vec
        extra_options = transformer_options.copy()
        qkv, mlp = torch.split(self.linear1(apply_mod(self.pre_norm(x), 1 + mod.scale, mod.shift)),
                               [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
        q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.norm(q, k, v)
        q, k, v, pe = _pre_attention(q, k, v, pe, attn_mask, transformer_options, extra_options)
        attn = attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options)
        for p in _run_patches("attn1_output_patch", transformer_options):
            attn = p(attn, extra_options)
        x += apply_mod(self.linear2(torch.cat((attn, self.mlp_act(mlp)), 2)), mod.gate)
        return x


class Flux(nn.Module):
    """Flux (modulation=True) or Flux.2 (modulation=False: one shared modulation computed by the model)."""

    def __init__(self, hidden_size, num_heads, depth, depth_single, modulation=True):
        super().__init__()
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(hidden_size, num_heads, modulation=modulation)
                                           for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(hidden_size, num_heads, modulation=modulation)
                                           for _ in range(depth_single))
        if not modulation:
            self.double_stream_modulation_img = blocks.Modulation(hidden_size, double=True)
            self.double_stream_modulation_txt = blocks.Modulation(hidden_size, double=True)
            self.single_stream_modulation = blocks.Modulation(hidden_size, double=False)

    def forward(self, img, txt, vec, pe, transformer_options={}):
        double_vec, single_vec = vec, vec
        if not hasattr(self.double_blocks[0], "img_mod"):
            double_vec = (self.double_stream_modulation_img(vec), self.double_stream_modulation_txt(vec))
            single_vec = self.single_stream_modulation(vec)[0]
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=double_vec, pe=pe, attn_mask=None,
                             transformer_options=transformer_options)
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = block(x, vec=single_vec, pe=pe, attn_mask=None, transformer_options=transformer_options)
        return x[:, txt.shape[1]:]


class WanSelfAttention(blocks.WanSelfAttention):
    def forward(self, x, freqs, transformer_options={}):
        b, s, n, d = *x.shape[:2], self.num_heads, self.head_dim
        q = apply_rope1(self.norm_q(self.q(x)).view(b, s, n, d), freqs)
        k = apply_rope1(self.norm_k(self.k(x)).view(b, s, n, d), freqs)
        x = optimized_attention(q.view(b, s, n * d), k.view(b, s, n * d), self.v(x).view(b, s, n * d),
                                heads=self.num_heads, transformer_options=transformer_options)
        for p in transformer_options.get("patches", {}).get("attn1_patch", []):
            x = p({"x": x, "q": q, "k": k, "transformer_options": transformer_options})
        return self.o(x)


class WanAttentionBlock(blocks.WanAttentionBlock):
    def __init__(self, dim, ffn_dim, num_heads, eps=1e-6):
        super().__init__(dim, ffn_dim, num_heads, eps)
        self.self_attn = WanSelfAttention(dim, num_heads, eps)

    def forward(self, x, e, freqs, context, context_img_len=257, transformer_options={}):
        modulation = self.modulation.to(dtype=x.dtype, device=x.device)
        e = (modulation + e).chunk(6, dim=1) if e.ndim < 4 else (modulation.unsqueeze(0) + e).unbind(2)
        x = x.contiguous()
        y = self.self_attn(torch.addcmul(repeat_e(e[0], x), self.norm1(x), 1 + repeat_e(e[1], x)), freqs,
                           transformer_options=transformer_options)
        x = torch.addcmul(x, y, repeat_e(e[2], x))
        x = x + self.cross_attn(self.norm3(x), context, context_img_len=context_img_len,
                                transformer_options=transformer_options)
        y = self.ffn(torch.addcmul(repeat_e(e[3], x), self.norm2(x), 1 + repeat_e(e[4], x)))
        return torch.addcmul(x, y, repeat_e(e[5], x))


class WanModel(blocks.WanModel):
    def __init__(self, dim, ffn_dim, num_heads, depth):
        super().__init__(dim, ffn_dim, num_heads, depth)
        self.blocks = nn.ModuleList(WanAttentionBlock(dim, ffn_dim, num_heads) for _ in range(depth))

    def forward(self, x, e, freqs, context, transformer_options={}):
        for block in self.blocks:
            x = block(x, e=e, freqs=freqs, context=context, context_img_len=0,
                      transformer_options=transformer_options)
        return x


class FluxTorchNorm(blocks.Flux):
    """blocks.py's 0.3.64-shaped Flux with its QK norms as torch nn.RMSNorm (weight `weight`, eps None)."""

    def __init__(self, hidden_size, num_heads, depth, depth_single):
        super().__init__(hidden_size, num_heads, depth, depth_single)
        for block in self.double_blocks:
            _with_torch_norms(block.img_attn)
            _with_torch_norms(block.txt_attn)
        for block in self.single_blocks:
            block.norm = QKNorm(hidden_size // num_heads)


def make_flux(era="2026", modulation=True, hidden=64, heads=4, depth=1, depth_single=1, batch=2, img_len=24,
              txt_len=8, seed=0):
    """(model, inputs) like blocks.make_flux_stack: era "2026" (this module's blocks; modulation=False is Flux.2)
    or "torch_norm" (0.3.64 forwards, torch QK norms)."""
    build = (lambda: Flux(hidden, heads, depth, depth_single, modulation)) if era == "2026" else (
        lambda: FluxTorchNorm(hidden, heads, depth, depth_single))
    model, generator = blocks._random_model(build, torch.float32, "cpu", seed, "newer")
    _, inputs = blocks.make_flux_stack(hidden=hidden, heads=heads, batch=batch, img_len=img_len, txt_len=txt_len,
                                       seed=seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape, generator=generator))
    return model, inputs


def make_wan(hidden=64, heads=4, ffn=128, depth=1, seed=0):
    model, _ = blocks._random_model(lambda: WanModel(hidden, ffn, heads, depth), torch.float32, "cpu", seed,
                                    "newer")
    _, inputs = blocks.make_wan_stack(dim=hidden, heads=heads, ffn_dim=ffn, seed=seed)
    return model, inputs


def run_with(model, inputs, transformer_options) -> torch.Tensor:
    fresh = {k: v.clone() for k, v in inputs.items()}
    with torch.inference_mode():
        return model(**fresh, transformer_options=transformer_options)


__all__ = ["CK", "Flux", "WanModel", "FluxTorchNorm", "ModulationOut", "make_flux", "make_wan", "run_with"]
