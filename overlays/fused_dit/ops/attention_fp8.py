"""Low-precision attention forward (issue 28's `fp8` mode, the project's own kernel): softmax(q k^T * sm_scale) v
with 8-bit Q K^T, fp32 accumulation, for sm_89 (Ada, RTX 4090) and sm_90 (Hopper), non-causal, no mask.

Layout: ComfyUI's attention layout, q `[B, H, Sq, D]`, k and v `[B, H, Skv, D]` (any strides; Sq may differ from
Skv, as in Wan's cross-attention), D in {64, 128}, bf16 or fp16; the output is contiguous `[B, H, Sq, D]` in q's
dtype.

Formats (AttentionFP8Launch: `qk_int8`, `pv_fp8`). Q K^T in INT8 by default (SageAttention's choice), or e4m3;
P V in the inputs' 16-bit dtype by default (as SageAttention 1), or e4m3. Why: the e4m3 unit roundoff (2^-4,
relative to each value) enters every logit, and DiT queries and keys, with a few large channels after their
RMSNorm, make logits large; INT8's error is half a code of the block's maximum (1/254 of it), which costs those
logits far less. e4m3 P carries the same 2^-4 into every P V term, where the output of attention over many
tokens is much smaller than its terms. So the default keeps the per call error at SageAttention 1's level; the
e4m3 formats stay as launch options for the sweep (`python -m benchmarks attention-kernels` measures both, speed
and error). Both GPUs run all of them through Triton's `tl.dot` (mma.sync on sm_89, wgmma on sm_90; INT8 and FP8
at the same tensor-core rate, 16-bit P V at half of it).

SageAttention 2's recipe (`sage2_recipe(launch)`, `sage2_launch_for(capability)`, `attention_fp8_sage2`; launch
fields `q_group` and `v_per_channel`), written here from its description, not its code: INT8 Q K^T with Q's scales
per group of the rows one warp owns (block_m / num_warps) and smoothed K per BLOCK_N block as above; e4m3 P V with
V's scales per head-dim channel over all tokens of a (batch, head), V quantised once before the attention kernel and
the scales applied to the output's columns at the end (a constant per column commutes with the softmax's weighted
sum); P's codes as above. fp32 accumulation the two-level way: each P V tile's FP8 product is a fresh fp32
accumulator (a zero-initialised `tl.dot`), scaled by P's 1 / 448 and added to the running fp32 output on the CUDA
cores. Why: the FP8 tensor-core MMA of both GPUs accumulates with fewer mantissa bits than fp32 (SageAttention 2's
finding on Ada and Hopper; Triton leaves wgmma's FP8 accumulation imprecise on sm_90 by default), so one accumulator
carried across the whole key sequence would lose the small late terms; two levels bound that loss to one tile's
BLOCK_N products. A bare `acc + tl.dot(p, v)` would not do: Triton folds the sum into the dot's accumulator wherever
the dot may accumulate in full precision (sm_89's mma.sync), so the scale between them is kept on purpose (the
compile test reads the built kernel's dot and checks its accumulator is zero). The pack's default launches keep
per-block scales (q_group 0, v_per_channel False); the recipe is a separate launch, measured as the benchmark's
`fp8_sage2` row and chosen by the `fp8` mode only under SageAttention 2's yardstick.

Quantisation (all scales fp32, derived on the GPU, no host sync):
- Q: per (batch, head, block of BLOCK_M rows), inside the attention kernel: scale = max(absmax, 1e-12) / 127
  and codes = round(q / scale), half to even (e4m3: / 448, codes = e4m3(q / scale)). The softmax scale and
  log2(e) are folded into the fp32 rescale of each Q K^T tile.
- K: smoothed first (SageAttention's trick: k - mean over the tokens of (batch, head); softmax is invariant to a
  per-row shift q.mean, so this changes only the rounding), then per (batch, head, block of BLOCK_N rows).
- Q with q_group: per group of q_group rows inside the block, the same rounding.
- V (pv_fp8): per (batch, head, block of BLOCK_N rows), e4m3, stored transposed where asked; else V as given.
  v_per_channel: per (batch, head, channel), scale = max(absmax over the tokens, 1e-12) / 448 (`channel_scales`,
  torch ops on the GPU), codes = e4m3(v / scale) by the quantiser kernel.
- P (in [0, 1] after exp2(s - running max)): rounded to V's dtype, or (pv_fp8) codes = e4m3(p * 448) with each
  P V tile rescaled by sv / 448. The row sums use the unquantised fp32 p.

Tiling (FlashAttention-2 style): one program per (BLOCK_M rows of Q, batch x head), walking K and V in tiles of
BLOCK_N with an online softmax in base 2. The eager FP8 reference (`attention_fp8_reference`) runs the same
tiles, the same quantisation and the same online softmax in fp32 torch ops; `attention_exact_reference` is fp32
SDPA on the unquantised inputs; `error_bound` is the elementwise bound between the two that follows from the
formats' rounding (derivation in its docstring).

Under TRITON_INTERPRET=1 the interpreter's fp32 -> e4m3 cast loses round-ups in a few percent of codes (FACTS) and
its fp32 -> bf16/fp16 cast truncates, so there (only) the kernels round to the format's grid in fp32 arithmetic
first (`round_to_grid`, to nearest even), after which the cast is exact; compiled kernels use the hardware
conversions (cvt.rn.satfinite.e4m3x2.f32 and cvt.rn).

`refusal(q, k, v)` says why the kernel cannot take a call (a reason string, None when it can); `attention_fp8`
never raises for such a call: it says the reason once and returns exact attention. The attention family's `fp8`
mode (integration/attention_fp8.py) runs it through ComfyUI's attention override.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import dispatch
from ..library import compiling, register
from . import cdiv, eager_because

try:
    import triton
    import triton.language as tl
except Exception:  # dispatch.triton_import_error() gives the reason; the references still work
    triton = None

OP = "attention_fp8"
FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0
P_UNIT = 1.0 / E4M3_MAX      # (v_per_channel) P's codes are p * 448: each P V tile's product times this, in fp32
# e4m3: 3 mantissa bits, so round to nearest has a relative error of at most 2^-4 for normal values, and an
# absolute error of at most half the subnormal spacing 2^-9 (in code units) below 2^-6
E4M3_UNIT_ROUNDOFF = 2.0 ** -4
E4M3_HALF_SUBNORMAL_SPACING = 2.0 ** -10
ABSMAX_FLOOR = 1e-12
INT8_MAX = 127.0
# P's rounding where P V runs in the inputs' 16-bit dtype: unit roundoff, and half the smallest spacing (p <= 1)
P16_ROUNDING = {torch.bfloat16: (2.0 ** -8, 2.0 ** -134), torch.float16: (2.0 ** -11, 2.0 ** -25)}
LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)
MIN_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class AttentionFP8Launch:
    """How the FP8 attention kernel is launched: BLOCK_M query rows per program (also Q's scale block), BLOCK_N key
    rows per step (also K's and V's scale block), warps and pipelining stages, and V's layout. `v_transposed`
    stores V's codes as [B, H, D, S] (K-major for the P V product: the FP8 tensor cores on sm_89 and sm_90 take
    8-bit operands only with the reduction dimension contiguous, so V stored [S, D] costs a transpose per tile).
    The per-architecture defaults (LAUNCHES) are starting points after Triton's fused-attention tutorial for FP8,
    until a GPU sweep (`python -m benchmarks attention-kernels`) picks them."""
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    quantize_num_warps: int = 4
    v_transposed: bool = True
    qk_int8: bool = True          # Q K^T with INT8 codes (SageAttention's choice); False: e4m3
    pv_fp8: bool = False          # P V with e4m3 codes; False: P rounded to the inputs' dtype, V as given
    q_group: int = 0              # Q's scale per group of this many rows (a power of two dividing block_m); 0: block
    v_per_channel: bool = False   # (pv_fp8) V's scales per head-dim channel over all tokens, applied to the output

    def __post_init__(self):
        if self.q_group and (self.q_group & (self.q_group - 1) or self.block_m % self.q_group):
            raise ValueError(f"q_group {self.q_group} is not a power of two dividing block_m {self.block_m}")
        if self.v_per_channel and not self.pv_fp8:
            raise ValueError("v_per_channel scales V's e4m3 codes: it needs pv_fp8")

    @property
    def label(self) -> str:
        qk = "qk-i8" if self.qk_int8 else "qk-e4m3"
        if self.q_group:
            qk += f" q{self.q_group}"
        pv = f"pv-e4m3 {'vT' if self.v_transposed else 'v'}" if self.pv_fp8 else "pv-16"
        if self.v_per_channel:
            pv += " v-channel"
        return f"m{self.block_m} n{self.block_n} w{self.num_warps} s{self.num_stages} {qk} {pv}"


LAUNCH = AttentionFP8Launch()
# compute capability -> the launch a call on that GPU gets (LAUNCH elsewhere: the interpreter, other GPUs)
# sm_90: the sweep of attention-kernels-h200.json (earlier_sweep.shapes.*.fp8_sweep): among launches at
# SageAttention 1's error, 128x64 tiles with 8 warps were as fast as 128x128 at Flux 2048/4096 and Wan, faster at Flux 1024, with less error
LAUNCHES = {(9, 0): AttentionFP8Launch(block_m=128, block_n=64, num_warps=8, num_stages=3),
            (8, 9): AttentionFP8Launch(block_m=128, block_n=64, num_warps=4, num_stages=3)}


def launch_for(capability: tuple[int, int] | None) -> AttentionFP8Launch:
    """The default launch for a GPU of this compute capability (None: no GPU, the interpreter)."""
    return LAUNCHES.get(tuple(capability), LAUNCH) if capability else LAUNCH


def launch_for_device(device: torch.device) -> AttentionFP8Launch:
    return launch_for(torch.cuda.get_device_capability(device) if device.type == "cuda" else None)


def sage2_recipe(launch: AttentionFP8Launch) -> AttentionFP8Launch:
    """`launch`'s tiles and warps on SageAttention 2's recipe (the module says what): INT8 Q K^T with Q's scale per
    group of the rows one warp owns (block_m / num_warps: 16 rows with 8 warps on sm_90's 128-row tiles, where a
    warpgroup's wgmma takes 64 rows; 32 with 4 warps on sm_89), e4m3 P V with V's scales per channel."""
    return dataclasses.replace(launch, qk_int8=True, pv_fp8=True, v_per_channel=True,
                               q_group=launch.block_m // launch.num_warps)


def sage2_launch_for(capability: tuple[int, int] | None) -> AttentionFP8Launch:
    """The SageAttention 2 recipe's launch for a GPU of this compute capability (None: the interpreter): the default
    launch's tiles and warps, until the device run (`attention-kernels`, row `fp8_sage2`) picks its own."""
    return sage2_recipe(launch_for(capability))


def sage2_launch_for_device(device: torch.device) -> AttentionFP8Launch:
    return sage2_launch_for(torch.cuda.get_device_capability(device) if device.type == "cuda" else None)


# ---------------------------------------------------------------------------------------------------------------
# refusal: why a call stays on exact attention
# ---------------------------------------------------------------------------------------------------------------

def refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """None when the kernel can take (q, k, v); else the reason, in one line, for the caller to say once."""
    if dispatch.triton_import_error() or triton is None:
        return dispatch.triton_import_error() or "triton is not importable"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"needs [B, H, S, D] tensors, got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"needs bf16 or fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    b, h, _, d = q.shape
    if d not in HEAD_DIMS:
        return f"head dim {d} is not one of {HEAD_DIMS}"
    if k.shape != v.shape or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
        return f"k and v must be [{b}, {h}, S, {d}] like q, got {tuple(k.shape)} and {tuple(v.shape)}"
    if q.shape[2] == 0 or k.shape[2] == 0:
        return "empty sequence"
    if max(q.numel(), k.numel()) >= 2 ** 31:
        return "more than 2^31 elements per tensor (int32 offsets)"
    devices = {q.device, k.device, v.device}
    if len(devices) != 1:
        return f"q, k, v on different devices {sorted(map(str, devices))}"
    device = q.device
    if device.type == "cuda":
        return capability_refusal(torch.cuda.get_device_capability(device))
    if device.type == "cpu" and dispatch.interpreting():
        return None
    return f"tensors on {device.type} (the FP8 kernel runs on sm_89+ CUDA GPUs)"


def capability_refusal(capability: tuple[int, int]) -> str | None:
    """None for sm_89 and later; else why a GPU of that compute capability stays on exact attention."""
    major, minor = capability
    if (major, minor) < MIN_CAPABILITY:
        return f"sm_{major}{minor} is below sm_89, the first GPU with FP8 tensor cores"
    return None


# ---------------------------------------------------------------------------------------------------------------
# eager references
# ---------------------------------------------------------------------------------------------------------------

def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)


def e4m3_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 values of the e4m3 codes of x (fp32, in code units): clamp to +-448, round to nearest even."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE).float()


def quantize_blocks_reference(x: torch.Tensor, block: int, mean: torch.Tensor | None = None, int8: bool = False
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, head, block of `block` rows) e4m3 (or int8: scale = absmax / 127, round half to even)
    quantisation of `[B, H, S, D]` x (minus `mean`, fp32 `[B, H, 1, D]`, where given): (codes float8_e4m3fn or
    int8 `[B, H, S, D]`, scales fp32 `[B, H, ceil(S / block)]`)."""
    b, h, s, d = x.shape
    xf = x.float()
    if mean is not None:
        xf = xf - mean
    blocks = cdiv(s, block)
    padded = F.pad(xf, (0, 0, 0, blocks * block - s)).view(b, h, blocks, block, d)
    absmax = padded.abs().amax(dim=(3, 4)).clamp_min(ABSMAX_FLOOR)
    top = INT8_MAX if int8 else E4M3_MAX
    scales = absmax / torch.full((), top, dtype=torch.float32, device=x.device)
    scaled = (padded / scales[..., None, None]).clamp(-top, top)
    codes = scaled.round().to(torch.int8) if int8 else scaled.to(FP8_DTYPE)
    return codes.view(b, h, blocks * block, d)[:, :, :s], scales


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """fp32 `[B, H, S, D]` values of quantize_blocks' codes and scales."""
    rows = torch.arange(codes.shape[2], device=codes.device) // block
    return codes.float() * scales[:, :, rows, None]


def channel_scales(v: torch.Tensor) -> torch.Tensor:
    """V's per-channel e4m3 scales (SageAttention 2's recipe), fp32 `[B, H, D]`: max(absmax over the tokens, floor)
    / 448 per (batch, head, channel), in torch ops on v's device (no host sync; kernel and reference share them)."""
    absmax = v.abs().amax(dim=2).float().clamp_min(ABSMAX_FLOOR)
    return absmax / torch.full((), E4M3_MAX, dtype=torch.float32, device=v.device)


def quantize_channels_reference(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V's e4m3 codes with per-channel scales: (codes float8_e4m3fn `[B, H, S, D]`, scales fp32 `[B, H, D]`)."""
    scales = channel_scales(v)
    return (v.float() / scales[:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE), scales


def key_mean(k: torch.Tensor) -> torch.Tensor:
    """K's smoothing mean, fp32 `[B, H, 1, D]` (one torch op, no fp32 copy of k: kernel and reference use the same
    values)."""
    return k.mean(dim=2, keepdim=True, dtype=torch.float32)


def attention_fp8_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                            launch: AttentionFP8Launch = LAUNCH, smooth_k: bool = True) -> torch.Tensor:
    """The kernel's math in fp32 torch ops: the same quantisation, the same tiles, the same online softmax (with
    v_per_channel: each P V tile's product in code units added to the running output, V's scales and P's 1 / 448
    applied to the output's columns at the end, P's 1 / 448 to each tile's product)."""
    b, h, sq, d = q.shape
    skv = k.shape[2]
    bm, bn = launch.block_m, launch.block_n
    q_block = launch.q_group or bm
    qk_const = torch.tensor((sm_scale or default_scale(d)) * LOG2E, dtype=torch.float32)
    q_codes, q_scales = quantize_blocks_reference(q, q_block, int8=launch.qk_int8)
    k_codes, k_scales = quantize_blocks_reference(k, bn, key_mean(k) if smooth_k else None, int8=launch.qk_int8)
    if launch.v_per_channel:
        v_codes, v_channel_scales = quantize_channels_reference(v)
    elif launch.pv_fp8:
        v_codes, v_scales = quantize_blocks_reference(v, bn)
    q_codes = q_codes.float()
    q_row_scale = q_scales[:, :, torch.arange(sq, device=q.device) // q_block, None]    # [B, H, Sq, 1]
    p_max = torch.full((), E4M3_MAX, dtype=torch.float32, device=q.device)
    p_unit = torch.full((), P_UNIT, dtype=torch.float32, device=q.device)
    m = torch.full((b, h, sq), -math.inf, device=q.device)
    l = torch.zeros((b, h, sq), device=q.device)
    acc = torch.zeros((b, h, sq, d), device=q.device)
    for j in range(cdiv(skv, bn)):
        cols = slice(j * bn, min((j + 1) * bn, skv))
        kj = k_codes[:, :, cols].float()
        s = (q_codes @ kj.transpose(-1, -2)) * ((q_row_scale * k_scales[:, :, j, None, None]) * qk_const)
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s - m_new[..., None])
        l = l * alpha + p.sum(dim=-1)
        if launch.v_per_channel:
            pv = (e4m3_codes(p * p_max) @ v_codes[:, :, cols].float()) * p_unit
        elif launch.pv_fp8:
            pv = (e4m3_codes(p * p_max) @ v_codes[:, :, cols].float()) * (v_scales[:, :, j, None, None] / p_max)
        else:
            pv = p.to(v.dtype).float() @ v[:, :, cols].float()
        acc = acc * alpha[..., None] + pv
        m = m_new
    out = acc / l[..., None]
    if launch.v_per_channel:
        out = out * v_channel_scales[:, :, None]
    return out.to(q.dtype)


def attention_exact_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              sm_scale: float | None = None) -> torch.Tensor:
    """fp32 SDPA on the unquantised inputs (fp32 out): what the FP8 error is measured against."""
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=sm_scale or default_scale(q.shape[-1]))


def error_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                launch: AttentionFP8Launch = LAUNCH, smooth_k: bool = True) -> torch.Tensor:
    """Elementwise bound on |attention_fp8 - attention_exact_reference|, fp64 `[B, H, Sq, D]`, from the rounding
    of the quantised operands alone (e4m3: u = 2^-4 relative plus half the subnormal spacing, 2^-10 code units,
    absolute; int8: half a code, s / 2, absolute; P in a 16-bit dtype: its unit roundoff).

    Each quantised operand x (q, smoothed k; v where P V is FP8; s its block scale) obeys |x^ - x| <= e_x
    (e4m3: u|x| + 2^-10 s; int8: s / 2). Logits: |s^_ij - s_ij| <= sm_scale * sum_d (e_q (|k| + e_k) + |q| e_k)
    <= delta_i (the max over j); the smoothing shifts row i by a constant, which softmax ignores. Softmax weights w
    (exact) and w^ (of the quantised logits): each ratio w^_j / w_j lies in [e^-2delta, e^2delta]. P's codes are
    p (1 + theta) + phi with |theta| <= u_p and |phi| <= eta_p (p <= 1; e4m3: u, 2^-10 / 448), over fp32 row sums
    l >= 1 (the row maximum adds 1); V's are v (1 + theta_v) + phi_v with |theta_v| <= u_v, |phi_v| <= eta_v sv
    (e4m3: u, 2^-10; V as given: 0, 0; sv_jd the scale of v_jd: its block's, or with v_per_channel its channel's,
    applied to the output at the end, a scaling the terms below commute with). With A_id = sum_j w_ij |v_jd| and
    Asv_id = sum_j w_ij sv_jd:
      |o^_id - o_id| <= (e^(2 delta_i) - 1) A_id + e^(2 delta_i) (((1 + u_p)(1 + u_v) - 1) A_id
                        + (1 + u_p) eta_v Asv_id) + Skv * eta_p * max_j ((1 + u_v) |v_jd| + eta_v sv_jd),
    plus fp32 arithmetic (delta scaled by 1 + 2^-10, and Skv * 2^-22 * max_j |v_jd|). Relative to the weighted
    mean of |v|: about 2 delta + u_p + u_v, where delta grows with sm_scale * sum_d |q_d| |k_d|. Finer Q scales
    (q_group) shrink e_q and so delta. The fp32 terms assume fp32 arithmetic, as the reference and the interpreter
    do; the GPUs' FP8 MMA accumulates one P V tile at reduced precision (the module docstring), which this bound
    leaves out.
    """
    u, eta = E4M3_UNIT_ROUNDOFF, E4M3_HALF_SUBNORMAL_SPACING
    scale = sm_scale or default_scale(q.shape[-1])
    bm, bn = launch.q_group or launch.block_m, launch.block_n
    _, q_scales = quantize_blocks_reference(q, bm, int8=launch.qk_int8)
    k_mean = key_mean(k) if smooth_k else None
    _, k_scales = quantize_blocks_reference(k, bn, k_mean, int8=launch.qk_int8)
    qf, kf, vf = q.double(), k.double(), v.double()
    ks = kf - k_mean.double() if smooth_k else kf
    q_rows = torch.arange(q.shape[2], device=q.device) // bm
    kv_rows = torch.arange(k.shape[2], device=k.device) // bn
    if launch.qk_int8:
        e_q = 0.5 * q_scales[:, :, q_rows, None].double().expand_as(qf)
        e_k = 0.5 * k_scales[:, :, kv_rows, None].double().expand_as(ks)
    else:
        e_q = u * qf.abs() + eta * q_scales[:, :, q_rows, None].double()
        e_k = u * ks.abs() + eta * k_scales[:, :, kv_rows, None].double()
    logit = e_q @ (ks.abs() + e_k).transpose(-1, -2) + qf.abs() @ e_k.transpose(-1, -2)
    # (1 + 2^-10) covers the fp32 arithmetic of the logits (a few roundings of 2^-24 each)
    delta = scale * (1 + 2.0 ** -10) * logit.amax(dim=-1, keepdim=True)          # [B, H, Sq, 1]
    w = torch.softmax(scale * (qf @ kf.transpose(-1, -2)), dim=-1)                 # [B, H, Sq, Skv]
    if launch.pv_fp8:
        u_p, eta_p, u_v, eta_v = u, eta / E4M3_MAX, u, eta
        if launch.v_per_channel:
            sv = channel_scales(v)[:, :, None, :].double().expand_as(vf)               # [B, H, Skv, D]
        else:
            sv = quantize_blocks_reference(v, bn)[1][:, :, kv_rows, None].double()  # [B, H, Skv, 1]
    else:
        (u_p, eta_p), u_v, eta_v = P16_ROUNDING[v.dtype], 0.0, 0.0
        sv = torch.zeros_like(vf[..., :1])
    weighted_v, weighted_sv = w @ vf.abs(), w @ sv
    growth = torch.exp(2 * delta)
    p_term = k.shape[2] * eta_p * ((1 + u_v) * vf.abs() + eta_v * sv).amax(dim=2, keepdim=True)
    fp32_term = k.shape[2] * 2.0 ** -22 * vf.abs().amax(dim=2, keepdim=True)
    rounding = (1 + u_p) * (1 + u_v) - 1
    return (torch.expm1(2 * delta) * weighted_v + growth * (rounding * weighted_v + (1 + u_p) * eta_v * weighted_sv)
            + p_term + fp32_term)


# ---------------------------------------------------------------------------------------------------------------
# public entry point
# ---------------------------------------------------------------------------------------------------------------

def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                  launch: AttentionFP8Launch | None = None) -> torch.Tensor:
    """FP8 attention (launch None: the default for q's GPU, `launch_for`); where `refusal` gives a reason (or
    FUSED_DIT_BACKEND=eager), says it once and returns torch SDPA in q's dtype instead. Under torch.compile: one
    custom op (`torch.ops.fused_dit.attention_fp8`)."""
    scale = float(sm_scale or default_scale(q.shape[-1]))
    if compiling() and launch is None:
        return _ATTENTION_FP8(q, k, v, scale)
    reason = "FUSED_DIT_BACKEND=eager" if os.environ.get("FUSED_DIT_BACKEND") == "eager" else refusal(q, k, v)
    if reason is not None:
        eager_because(OP, reason)
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    return attention_fp8_triton(q, k, v, scale, launch or launch_for_device(q.device))


def attention_fp8_sage2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        sm_scale: float | None = None) -> torch.Tensor:
    """attention_fp8 on SageAttention 2's recipe (`sage2_launch_for_device`), with the same refusals and fallback."""
    return attention_fp8(q, k, v, sm_scale, sage2_launch_for_device(q.device))


def _attention_fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
    out = attention_fp8(q, k, v, sm_scale)
    if out.stride() != q.new_empty(q.shape).stride():     # SDPA's output (a refused call): the fake's layout
        out = q.new_empty(q.shape).copy_(out)
    return out


def _attention_fp8_fake(q, k, v, sm_scale):
    return q.new_empty(q.shape)


_ATTENTION_FP8 = register(OP, _attention_fp8_op, _attention_fp8_fake)


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels and launchers
# ---------------------------------------------------------------------------------------------------------------

if triton is not None:
    @triton.jit
    def round_to_grid(x, MANTISSA: tl.constexpr, MIN_BIASED: tl.constexpr):
        """x (fp32) rounded to nearest even on the grid of a format with MANTISSA bits whose smallest normal has
        biased exponent MIN_BIASED (fp32's bias), in fp32 arithmetic: the spacing is 2^(exponent - MANTISSA), the
        subnormals' below; adding and subtracting 1.5 * 2^23 spacings rounds to it. A negative x that rounds to
        zero keeps its sign (-0), as a cast gives."""
        biased = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
        spacing = ((tl.maximum(biased, MIN_BIASED) - MANTISSA) << 23).to(tl.float32, bitcast=True)
        magic = spacing * 12582912.0
        rounded = (x + magic) - magic
        return tl.where(rounded == 0.0, x * 0.0, rounded)

    @triton.jit
    def e4m3_grid(x):
        """x (fp32, within +-448) on e4m3's grid: 3 mantissa bits, spacing at least 2^-9 (subnormals)."""
        return round_to_grid(x, 3, 127 - 6)

    @triton.jit
    def to_e4m3(x, EXACT_GRID: tl.constexpr):
        """fp32 (code units) -> float8e4nv, saturating at +-448; EXACT_GRID rounds first (interpreter only)."""
        x = tl.minimum(tl.maximum(x, -448.0), 448.0)
        if EXACT_GRID:
            x = e4m3_grid(x)
        return x.to(tl.float8e4nv)

    @triton.jit
    def as_e4m3(codes, CODES_U8: tl.constexpr):
        """Loaded codes as float8e4nv: the interpreter's buffers are uint8 (numpy has no fp8), a GPU's are fp8
        already (a bitcast between the load and the dot would keep Triton from pipelining the load)."""
        if CODES_U8:
            codes = codes.to(tl.float8e4nv, bitcast=True)
        return codes

    @triton.jit
    def round_half_even(x):
        """x (fp32, |x| <= 2^22) rounded to the nearest integer, ties to even, in fp32 arithmetic (the
        interpreter and every GPU alike): adding and subtracting 1.5 * 2^23 leaves no fraction bits."""
        return (x + 12582912.0) - 12582912.0

    @triton.jit
    def quantize_tile(x, INT8: tl.constexpr, EXACT_GRID: tl.constexpr):
        """(codes, scale) of an fp32 tile: scale = max(absmax, floor) / 448 and e4m3 codes, or INT8: / 127 and
        int8 codes, round half to even."""
        absmax = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), 1e-12)
        if INT8:
            scale = tl.div_rn(absmax, 127.0)
            codes = round_half_even(tl.minimum(tl.maximum(tl.div_rn(x, scale), -127.0), 127.0)).to(tl.int8)
        else:
            scale = tl.div_rn(absmax, 448.0)
            codes = to_e4m3(tl.div_rn(x, scale), EXACT_GRID)
        return codes, scale

    @triton.jit
    def quantize_row_groups(x, ROWS: tl.constexpr, GROUP: tl.constexpr, INT8: tl.constexpr,
                            EXACT_GRID: tl.constexpr):
        """quantize_tile per group of GROUP rows of an fp32 [ROWS, D] tile: (codes, per-row scales [ROWS], each
        row's the scale of its group)."""
        row_max = tl.max(tl.abs(x), axis=1)
        group_max = tl.max(tl.reshape(row_max, [ROWS // GROUP, GROUP]), axis=1)
        absmax = tl.maximum(tl.reshape(tl.broadcast_to(group_max[:, None], [ROWS // GROUP, GROUP]), [ROWS]), 1e-12)
        if INT8:
            scale = tl.div_rn(absmax, 127.0)
            codes = round_half_even(tl.minimum(tl.maximum(tl.div_rn(x, scale[:, None]), -127.0), 127.0)).to(tl.int8)
        else:
            scale = tl.div_rn(absmax, 448.0)
            codes = to_e4m3(tl.div_rn(x, scale[:, None]), EXACT_GRID)
        return codes, scale

    @triton.jit
    def _quantize_blocks_kernel(x_ptr, mean_ptr, codes_ptr, scales_ptr, S, H, blocks,
                                stride_b, stride_h, stride_s, stride_d,
                                HAS_MEAN: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                                TRANSPOSED: tl.constexpr, INT8: tl.constexpr, EXACT_GRID: tl.constexpr,
                                CODES_U8: tl.constexpr, CHANNEL: tl.constexpr):
        """One (block of BLOCK rows, batch x head): codes (quantize_tile) into a buffer of blocks * BLOCK rows per
        (batch, head), [B, H, S_pad, D] or TRANSPOSED [B, H, D, S_pad] (rows past S get code 0, so the attention
        kernel loads whole tiles unmasked), the scale into [B * H, blocks]. CHANNEL: e4m3 codes of the per-channel
        scales given in scales_ptr ([B * H, D], read, not written). CODES_U8: e4m3 codes stored as uint8 (the
        interpreter's buffers: numpy has no fp8)."""
        block = tl.program_id(0)
        bh = tl.program_id(1)
        rows = block * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, D)
        valid = rows[:, None] < S
        base = x_ptr + (bh // H) * stride_b + (bh % H) * stride_h
        x = tl.load(base + rows[:, None] * stride_s + cols[None, :] * stride_d, mask=valid, other=0.0)
        x = x.to(tl.float32)
        if HAS_MEAN:
            x = tl.where(valid, x - tl.load(mean_ptr + bh * D + cols)[None, :], 0.0)
        if CHANNEL:
            codes = to_e4m3(tl.div_rn(x, tl.load(scales_ptr + bh * D + cols)[None, :]), EXACT_GRID)
        else:
            codes, scale = quantize_tile(x, INT8, EXACT_GRID)
        if CODES_U8 and not INT8:
            codes = codes.to(tl.uint8, bitcast=True)
        s_pad = blocks * BLOCK
        if TRANSPOSED:
            tl.store(codes_ptr + bh * s_pad * D + cols[:, None] * s_pad + rows[None, :], tl.trans(codes))
        else:
            tl.store(codes_ptr + bh * s_pad * D + rows[:, None] * D + cols[None, :], codes)
        if not CHANNEL:
            tl.store(scales_ptr + bh * blocks + block, scale)

    @triton.jit
    def _attention_fp8_kernel(q_ptr, k_codes_ptr, k_scales_ptr, v_ptr, v_scales_ptr, out_ptr,
                              Sq, Skv, H, kv_blocks, qk_const,
                              stride_qb, stride_qh, stride_qs, stride_qd,
                              stride_vb, stride_vh, stride_vs, stride_vd,
                              D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              QK_INT8: tl.constexpr, PV_FP8: tl.constexpr, V_TRANSPOSED: tl.constexpr,
                              MASK_KV: tl.constexpr, EXACT_GRID: tl.constexpr, CODES_U8: tl.constexpr,
                              Q_GROUP: tl.constexpr, V_CHANNEL: tl.constexpr):
        """One (BLOCK_M rows of Q, batch x head). K's codes (int8 or e4m3) and, with PV_FP8, V's (e4m3) come
        padded to whole tiles; without PV_FP8, v_ptr is V itself (strides given), P rounded to its dtype.
        Q_GROUP: Q's scale per group of that many rows (0: the block). V_CHANNEL: V's scales per channel
        ([B * H, D]), applied to the output's columns after the loop; each P V tile's FP8 product is a fresh fp32
        accumulator, times P's 1 / 448, added to the running output (the two-level sum, module docstring)."""
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, D)
        row_ok = rows < Sq
        q_base = q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh
        q = tl.load(q_base + rows[:, None] * stride_qs + cols[None, :] * stride_qd, mask=row_ok[:, None],
                    other=0.0).to(tl.float32)
        if Q_GROUP == 0:
            # Q's block scale: this program's rows are the block
            q_codes, q_scale = quantize_tile(q, QK_INT8, EXACT_GRID)
            q_const = q_scale * qk_const
        else:
            q_codes, q_scale = quantize_row_groups(q, BLOCK_M, Q_GROUP, QK_INT8, EXACT_GRID)
            q_const = (q_scale * qk_const)[:, None]

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        s_pad = kv_blocks * BLOCK_N
        kv_base = bh.to(tl.int64) * s_pad * D      # the codes buffers are padded to whole tiles: no load masks
        v_base = v_ptr + (bh // H).to(tl.int64) * stride_vb + (bh % H).to(tl.int64) * stride_vh
        n_offsets = tl.arange(0, BLOCK_N)
        for j in range(0, kv_blocks):
            kv_rows = j * BLOCK_N + n_offsets
            k_tile = tl.load(k_codes_ptr + kv_base + kv_rows[:, None] * D + cols[None, :])
            if QK_INT8:
                s = tl.dot(q_codes, tl.trans(k_tile), out_dtype=tl.int32).to(tl.float32)
            else:
                s = tl.dot(q_codes, tl.trans(as_e4m3(k_tile, CODES_U8)))
            s = s * (q_const * tl.load(k_scales_ptr + bh * kv_blocks + j))
            if MASK_KV:
                s = tl.where((kv_rows < Skv)[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if PV_FP8:
                if V_TRANSPOSED:
                    v_codes = tl.trans(as_e4m3(tl.load(v_ptr + kv_base + cols[:, None] * s_pad + kv_rows[None, :]),
                                               CODES_U8))
                else:
                    v_codes = as_e4m3(tl.load(v_ptr + kv_base + kv_rows[:, None] * D + cols[None, :]), CODES_U8)
                # p is in [0, 1]: its codes need no clamp
                if EXACT_GRID:
                    p_codes = e4m3_grid(p * 448.0).to(tl.float8e4nv)
                else:
                    p_codes = (p * 448.0).to(tl.float8e4nv)
                if V_CHANNEL:
                    # a fresh fp32 accumulator for this tile, scaled by P's 1 / 448 and added below to the running
                    # output in fp32: the MMA's reduced-precision accumulation spans one tile's BLOCK_N products.
                    # The product between the dot and the sum also keeps Triton from folding the sum into the
                    # dot's accumulator (it does so for `acc + dot(a, b)` wherever the dot may accumulate in full
                    # precision, sm_89's mma.sync included)
                    pv = tl.dot(p_codes, v_codes) * (1.0 / 448.0)
                else:
                    pv = tl.dot(p_codes, v_codes) * tl.div_rn(tl.load(v_scales_ptr + bh * kv_blocks + j), 448.0)
            else:
                v_offsets = kv_rows[:, None] * stride_vs + cols[None, :] * stride_vd
                if MASK_KV:
                    v = tl.load(v_base + v_offsets, mask=(kv_rows < Skv)[:, None], other=0.0)
                else:
                    v = tl.load(v_base + v_offsets)
                if CODES_U8:
                    # the interpreter truncates fp32 -> 16-bit casts and multiplies 16-bit floats by their bits:
                    # P rounded to v's grid in fp32 (bf16: 7 mantissa bits; fp16: 10, normals from 2^-14), the
                    # products exact in fp32 as the tensor cores make them
                    if v.dtype == tl.bfloat16:
                        p16 = round_to_grid(p, 7, 8)
                    else:
                        p16 = round_to_grid(p, 10, 127 - 14)
                    pv = tl.dot(p16, v.to(tl.float32))
                else:
                    pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        out = acc / l_i[:, None]
        if V_CHANNEL:
            out = out * tl.load(v_scales_ptr + bh * D + cols)[None, :]
        tl.store(out_ptr + bh.to(tl.int64) * Sq * D + rows[:, None] * D + cols[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _quantize_padded(x: torch.Tensor, block: int, mean: torch.Tensor | None, transposed: bool,
                     launch: AttentionFP8Launch, int8: bool = False, channel_scales: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantiser kernel: (codes, [B, H, S_pad, D] or transposed [B, H, D, S_pad] with S_pad = whole blocks and
    zero codes past S: int8, or float8_e4m3fn (uint8 under the interpreter); fp32 scales [B, H, blocks], or the
    given per-channel `channel_scales` [B, H, D], e4m3 codes of x divided by them)."""
    b, h, s, d = x.shape
    if x.requires_grad:     # the interpreter hands tensors to numpy, which refuses ones that require grad
        x = x.detach()
    blocks = cdiv(s, block)
    shape = (b, h, d, blocks * block) if transposed else (b, h, blocks * block, d)
    codes_u8 = dispatch.interpreting()
    codes = torch.empty(shape, dtype=torch.int8 if int8 else torch.uint8 if codes_u8 else FP8_DTYPE, device=x.device)
    if channel_scales is None:
        scales = torch.empty((b, h, blocks), dtype=torch.float32, device=x.device)
    else:
        scales = channel_scales.contiguous()
    mean_arg = mean.contiguous() if mean is not None else scales
    _quantize_blocks_kernel[(blocks, b * h)](
        x, mean_arg, codes, scales, s, h, blocks, *x.stride(),
        HAS_MEAN=mean is not None, D=d, BLOCK=block, TRANSPOSED=transposed, INT8=int8, EXACT_GRID=codes_u8,
        CODES_U8=codes_u8, CHANNEL=channel_scales is not None, num_warps=launch.quantize_num_warps)
    return codes, scales


def quantize_blocks_triton(x: torch.Tensor, block: int, mean: torch.Tensor | None = None,
                           launch: AttentionFP8Launch = LAUNCH, transposed: bool = False, int8: bool = False,
                           channel_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_blocks_reference (or, given `channel_scales`, quantize_channels_reference's codes) through the
    quantiser kernel: (codes float8_e4m3fn or int8 [B, H, S, D], a view of the padded buffer, transposed in memory
    where asked; scales fp32 [B, H, blocks], or the channel scales)."""
    s = x.shape[2]
    codes, scales = _quantize_padded(x, block, mean, transposed, launch, int8, channel_scales)
    if not int8:
        codes = codes.view(FP8_DTYPE)          # a no-op on a GPU's fp8 buffer
    view = codes.transpose(-1, -2) if transposed else codes
    return view[:, :, :s], scales


def attention_fp8_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                         launch: AttentionFP8Launch = LAUNCH, smooth_k: bool = True) -> torch.Tensor:
    """The kernels, for a call `refusal` accepts (ValueError otherwise: callers go through attention_fp8)."""
    reason = refusal(q, k, v)
    if reason is not None:
        raise ValueError(f"{OP}: {reason}")
    b, h, sq, d = q.shape
    skv = k.shape[2]
    if q.requires_grad:
        q, v = q.detach(), v.detach()
    k_codes, k_scales = _quantize_padded(k, launch.block_n, key_mean(k) if smooth_k else None, False, launch,
                                         launch.qk_int8)
    if launch.v_per_channel:        # V quantised once, over all tokens, before the attention kernel
        v_arg, v_scales = _quantize_padded(v, launch.block_n, None, launch.v_transposed, launch,
                                           channel_scales=channel_scales(v))
    elif launch.pv_fp8:
        v_arg, v_scales = _quantize_padded(v, launch.block_n, None, launch.v_transposed, launch)
    else:
        v_arg, v_scales = v, k_scales           # V as given (its strides below); no scales read
    out = torch.empty((b, h, sq, d), dtype=q.dtype, device=q.device)
    qk_const = float(sm_scale or default_scale(d)) * LOG2E
    _attention_fp8_kernel[(cdiv(sq, launch.block_m), b * h)](
        q, k_codes, k_scales, v_arg, v_scales, out,
        sq, skv, h, k_scales.shape[2], qk_const, *q.stride(), *v.stride(),
        D=d, BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, QK_INT8=launch.qk_int8, PV_FP8=launch.pv_fp8,
        V_TRANSPOSED=launch.v_transposed, MASK_KV=skv % launch.block_n != 0, EXACT_GRID=dispatch.interpreting(),
        CODES_U8=dispatch.interpreting(), Q_GROUP=launch.q_group, V_CHANNEL=launch.v_per_channel,
        num_warps=launch.num_warps, num_stages=launch.num_stages)
    return out


# ---------------------------------------------------------------------------------------------------------------
# ahead-of-time compilation for a GPU this machine need not have (the sm_89 / sm_90 build check)
# ---------------------------------------------------------------------------------------------------------------

def compile_for(arch: int, head_dim: int = 128, dtype: str = "bf16", launch: AttentionFP8Launch | None = None,
                mask_kv: bool = False) -> dict:
    """Compile the kernels (attention, K's and V's quantisers) for CUDA compute capability `arch` (89, 90) without a
    GPU, with the launch a call on that GPU gets (launch None) or `launch` (`sage2_launch_for(divmod(arch, 10))`:
    the SageAttention 2 recipe's): {kernel name: the compiled kernel's asm
    dict (ttir, ttgir, llir, ptx, cubin) and its `shared_bytes`}. Needs a Triton with triton.compile, GPUTarget and
    ASTSource, and TRITON_INTERPRET unset (interpreted kernels do not compile)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    launch = launch or launch_for(divmod(arch, 10))
    target = GPUTarget("cuda", arch, 32)
    ints = {name: "i32" for name in ("S", "H", "blocks", "Sq", "Skv", "kv_blocks")}
    strides = {f"stride_{s}": "i32" for s in ("b", "h", "s", "d", "qb", "qh", "qs", "qd", "vb", "vh", "vs", "vd")}
    k_codes = "*i8" if launch.qk_int8 else "*fp8e4nv"
    quantizer_pointers = {"x_ptr": f"*{dtype}", "mean_ptr": "*fp32", "codes_ptr": "*fp8e4nv", "scales_ptr": "*fp32"}
    k_quantizer_pointers = {**quantizer_pointers, "codes_ptr": k_codes}
    kernels = {
        "quantize_blocks": (_quantize_blocks_kernel, k_quantizer_pointers,      # K's: smoothed, [S, D]
                            {"HAS_MEAN": True, "D": head_dim, "BLOCK": launch.block_n, "TRANSPOSED": False,
                             "INT8": launch.qk_int8, "EXACT_GRID": False, "CODES_U8": False, "CHANNEL": False},
                            launch.quantize_num_warps),
        "quantize_v": (_quantize_blocks_kernel, quantizer_pointers,
                       {"HAS_MEAN": False, "D": head_dim, "BLOCK": launch.block_n,
                        "TRANSPOSED": launch.v_transposed, "INT8": False, "EXACT_GRID": False,
                        "CODES_U8": False, "CHANNEL": launch.v_per_channel},
                       launch.quantize_num_warps),
        "attention_fp8": (_attention_fp8_kernel,
                          {"q_ptr": f"*{dtype}", "k_codes_ptr": k_codes, "k_scales_ptr": "*fp32",
                           "v_ptr": "*fp8e4nv" if launch.pv_fp8 else f"*{dtype}", "v_scales_ptr": "*fp32",
                           "out_ptr": f"*{dtype}",
                           "qk_const": "fp32"},
                          {"D": head_dim, "BLOCK_M": launch.block_m, "BLOCK_N": launch.block_n,
                           "QK_INT8": launch.qk_int8, "PV_FP8": launch.pv_fp8, "V_TRANSPOSED": launch.v_transposed,
                           "MASK_KV": mask_kv, "EXACT_GRID": False, "CODES_U8": False,
                           "Q_GROUP": launch.q_group, "V_CHANNEL": launch.v_per_channel},
                          launch.num_warps),
    }
    if not launch.pv_fp8:
        del kernels["quantize_v"]           # V goes to the kernel as given
    compiled = {}
    for name, (kernel, pointers, constexprs, num_warps) in kernels.items():
        # as a launch specialises them: the last dim's strides 1 (a constant), the other strides and the pointers
        # multiples of 16 (torch's allocations, ComfyUI's [B, S, heads * D] views), so the loads vectorise and
        # pipeline as they do at run time
        constexprs = {**constexprs, **{arg: 1 for arg in kernel.arg_names if arg.startswith("stride_")
                                       and arg.endswith("d")}}
        signature = {}
        for arg in kernel.arg_names:
            signature[arg] = "constexpr" if arg in constexprs else pointers.get(arg) or ints.get(arg) or strides[arg]
        aligned = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]]
                   for arg in kernel.arg_names if signature[arg].startswith("*")
                   or (arg.startswith("stride_") and arg not in constexprs)}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
        options = {"num_warps": num_warps, "num_stages": launch.num_stages}
        kernel_binary = triton.compile(source, target=target, options=options)
        compiled[name] = {**kernel_binary.asm, "shared_bytes": getattr(kernel_binary.metadata, "shared", None)}
    return compiled
