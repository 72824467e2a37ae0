"""Op 6: FP8 linear layers through torch._scaled_mm: tensors in, tensors out.

Two weight sources, both held as an `Fp8Weight`:
- bf16/fp16 weights: quantised once to e4m3 with a per-tensor scale (absmax/448, op 5: `quantize_weight_fp8`);
  activations use op 5's dynamic per-tensor scale, and the GEMM uses Hopper's fast FP8 accumulation
  (`Fp8LinearSettings.fast_accum`).
- row-wise (`quantize_weight_fp8_rows`, bf16 activations only: torch._scaled_mm's row-wise mode gives bf16): one
  fp32 scale per output channel, and per activation row (ops.quantize_fp8_rows, one launch per tensor, no absmax
  pass). A weight quantised for one call only (`per_call_weight`: DynamicVRAM's per-call codes) keeps its bf16
  source, and its codes are made in the same launch as the activation's: two launches per Linear instead of five.
- float8_e4m3fn weights (ComfyUI's fp8 checkpoints, `scale_weight`/`scale_input`): the checkpoint's own codes and
  scales, with ComfyUI's static activation semantics (unit or static scale, in-place clamp): the same _scaled_mm
  call as ComfyUI's fp8_linear, with the input quantisation fused into one kernel.

Which nn.Module may run in FP8, the per-module weight cache and the stock-forward fallback live in
`fused_dit.integration.fp8_modules`.

GEMM constraints (FACTS.md): 2-D operands, first row-major, second column-major (`W8.t()`), fp32 scales, bias in
the output dtype, sm_89+. Below sm_89 or on CPU `linear_fp8` emulates the GEMM in fp32 from the dequantised codes,
which CPU tests use to check the quantisation and reshaping logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# imported here, not inside the functions: a function-level import costs microseconds on every call
from ..state import STATE
from .gelu_quantize_fp8 import gelu_quantize_comfy_triton, gelu_quantize_dynamic_triton
from .quantize_fp8 import (FP8_DTYPE, fp8_choice, gemm_stats, quantize_comfy_triton, quantize_dynamic_triton,
                           quantize_fp8_comfy, quantize_fp8_dynamic)
from .quantize_fp8_rows import quantize_pair_triton, quantize_rows

OP = "fp8_linear"
SUPPORTED_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
ROWWISE_ACTIVATION_DTYPES = (torch.bfloat16,)      # torch._scaled_mm's row-wise scaling outputs bf16 only


@dataclass(frozen=True)
class Fp8LinearSettings:
    """How the FP8 GEMM runs. fast_accum: Hopper's fast FP8 accumulation (`use_fast_accum`) for the overlay's own
    dynamic-scale path; ComfyUI's fp8 checkpoints (static input scale) always keep ComfyUI's exact `_scaled_mm`
    call. benchmarks/blocks.py times both and reports each one's relative Frobenius error against the bf16 linear
    (blocks.json)."""
    fast_accum: bool = True


SETTINGS = Fp8LinearSettings()


@dataclass(frozen=True)
class Fp8Weight:
    codes: torch.Tensor | None   # [N, K] float8_e4m3fn, row-major; the GEMM reads codes.t() (column-major).
                                 # None for a per-call weight: made from `source` in the activation's launch
    scale: torch.Tensor | None   # fp32 0-dim (per tensor) or [1, N] (row-wise: one per output channel)
    static_input: bool           # True: ComfyUI fp8 module (static/unit input scale); False: dynamic activations
    input_scale: torch.Tensor | None
    source_key: tuple
    source: torch.Tensor | None = None     # per-call weight: the bf16 weight itself (row-wise codes)
    # derived once here rather than on every call: the GEMM's column-major operand and fp32 scales
    codes_t: torch.Tensor | None = field(init=False, repr=False, compare=False)
    scale_fp32: torch.Tensor | None = field(init=False, repr=False, compare=False)
    activation_scale: torch.Tensor | None = field(init=False, repr=False, compare=False)
    rowwise: bool = field(init=False, repr=False, compare=False)   # activations get row-wise scales

    def __post_init__(self):
        object.__setattr__(self, "codes_t", None if self.codes is None else self.codes.t())
        object.__setattr__(self, "scale_fp32", None if self.scale is None else self.scale.float())
        object.__setattr__(self, "rowwise", self.source is not None
                           or (self.scale is not None and self.scale.dim() > 0 and not self.static_input))
        static_scale = None
        if self.static_input:
            static_scale = (torch.ones((), device=self.codes.device, dtype=torch.float32)
                            if self.input_scale is None else self.input_scale.float())
        object.__setattr__(self, "activation_scale", static_scale)


def quantize_weight_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3 codes [N, K] and fp32 0-dim scale for a bf16/fp16/fp32 weight."""
    codes, scale = quantize_fp8_dynamic(weight.detach())
    return codes.contiguous(), scale


def quantize_weight_fp8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3 codes [N, K] and fp32 scales [1, N] (one per output channel) for a bf16/fp16/fp32 weight."""
    codes, scales = quantize_rows(weight.detach())
    return codes, scales.reshape(1, -1)


def per_call_weight(weight: torch.Tensor) -> Fp8Weight:
    """An FP8 weight for one call of a bf16 weight (DynamicVRAM's per-call codes): nothing is quantised here; the
    GEMM makes its row-wise codes in the same launch as the activation's (`linear_fp8_triton`)."""
    return Fp8Weight(codes=None, scale=None, static_input=False, input_scale=None, source_key=(),
                     source=weight.detach())


def rowwise_fits(dtype: torch.dtype) -> bool:
    """Whether row-wise scaling serves activations of this dtype (torch._scaled_mm's row-wise mode outputs bf16)."""
    return dtype in ROWWISE_ACTIVATION_DTYPES


def prepare_stream(device: torch.device, dtype: torch.dtype) -> bool:
    """Make what the FP8 GEMM path keeps per (device, stream) before its first call: the stats buffer (gemm_stats)
    and the GEMM library's workspace, which the first torch._scaled_mm on a stream allocates (one tensor-wise and,
    for bf16, one row-wise GEMM on 16x32 zeros). A caller that records allocations call by call (ComfyUI's model
    compiler) runs this outside the record, so the first call allocates what every later call does. False where
    there was nothing to do (not CUDA, or done for this stream and dtype)."""
    if device.type != "cuda" or dtype not in SUPPORTED_ACTIVATION_DTYPES:
        return False
    key = (device, torch.cuda.current_stream(device).cuda_stream, dtype)
    if key in STATE.fp8_prepared_streams:
        return False
    STATE.fp8_prepared_streams.add(key)
    gemm_stats(device)
    codes = torch.zeros(16, 32, device=device, dtype=FP8_DTYPE)
    one = torch.ones((), device=device, dtype=torch.float32)
    _scaled_mm(codes, one, codes.t(), one, None, dtype)
    if rowwise_fits(dtype):
        _scaled_mm(codes, one.expand(16, 1).contiguous(), codes.t(), one.expand(1, 16).contiguous(), None, dtype)
    return True


def _scaled_mm(a_codes: torch.Tensor, a_scale: torch.Tensor, w_codes_t: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None, out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """torch._scaled_mm with operands already in the form it needs (fp32 scales, bias in out_dtype)."""
    out = torch._scaled_mm(a_codes, w_codes_t, scale_a=a_scale, scale_b=w_scale, bias=bias, out_dtype=out_dtype,
                           use_fast_accum=fast_accum)
    return out[0] if isinstance(out, tuple) else out


def matmul_fp8(a_codes: torch.Tensor, a_scale: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None, out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """out[M, N] = (a_codes*a_scale) @ (w_codes*w_scale).T + bias, a_codes [M, K] and w_codes [N, K] in e4m3."""
    if fp8_choice("fp8_scaled_mm", a_codes).triton and out_dtype in SUPPORTED_ACTIVATION_DTYPES:
        return _scaled_mm(a_codes, a_scale.float(), w_codes.t(), w_scale.float(),
                          None if bias is None else bias.to(out_dtype), out_dtype, fast_accum)
    # emulation for CPUs and older GPUs: the same codes and scales, fp32 accumulation (row-wise scales: a [M, 1],
    # w [1, N], one per output channel)
    a = a_codes.float() * a_scale.float()
    w = w_codes.float() * (w_scale.float().reshape(-1, 1) if w_scale.dim() else w_scale.float())
    out = a @ w.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def linear_fp8(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None,
               clamp_input_in_place: bool = True, settings: Fp8LinearSettings = SETTINGS) -> torch.Tensor:
    """F.linear with FP8 operands: x [..., K] -> [..., N] in x's dtype (each step dispatched: Triton or eager)."""
    k = x.shape[-1]
    x2d = x.reshape(-1, k)
    w_codes, w_scale = weight.codes, weight.scale
    if weight.static_input:
        a_codes = quantize_fp8_comfy(x2d, weight.input_scale, clamp_input_in_place=clamp_input_in_place)
        a_scale = weight.activation_scale
    elif weight.rowwise:
        a_codes, a_scale = quantize_rows(x2d)
        if weight.source is not None:
            w_codes, w_scale = quantize_rows(weight.source)
    else:
        a_codes, a_scale = quantize_fp8_dynamic(x2d)
    out = matmul_fp8(a_codes.reshape(-1, k), a_scale.to(x.device), w_codes, w_scale, bias, x.dtype,
                     fast_accum=settings.fast_accum and not weight.static_input)
    return out.reshape(*x.shape[:-1], w_codes.shape[0])


def linear_fp8_triton(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None,
                      settings: Fp8LinearSettings = SETTINGS) -> torch.Tensor:
    """linear_fp8 for a caller that has established that the Triton kernels and torch._scaled_mm run for x
    (fused_dit.integration.fp8_modules' plans): the same kernels and GEMM call, without asking dispatch again.
    bias is already in x's dtype and on x's device."""
    return _quantized_gemm(x, weight, bias, quantize_comfy_triton, quantize_dynamic_triton, settings)


def gelu_linear_fp8_triton(h: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None,
                           settings: Fp8LinearSettings = SETTINGS) -> torch.Tensor:
    """linear_fp8_triton of GELU_tanh(h), the GELU fused into the activation quantisation (op 7; per-tensor
    weights: a row-wise one takes the GELU first, then its own quantiser)."""
    if weight.rowwise:
        return _quantized_gemm(F.gelu(h, approximate="tanh"), weight, bias, quantize_comfy_triton,
                               quantize_dynamic_triton, settings)
    return _quantized_gemm(h, weight, bias, gelu_quantize_comfy_triton, gelu_quantize_dynamic_triton, settings)


def _quantized_gemm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None, quantize_static,
                    quantize_dynamic, settings: Fp8LinearSettings) -> torch.Tensor:
    """x [..., K] quantised by the given Triton quantisers (ComfyUI's static scale when the weight carries one, else
    dynamic per-tensor), then one torch._scaled_mm: [..., N] in x's dtype."""
    x2d = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if weight.static_input:
        a_codes = quantize_static(x2d, weight.input_scale)
        a_scale = weight.activation_scale
    elif weight.rowwise:
        # one launch: the activation's rows and, for a per-call weight, the weight's rows (its codes for this
        # call only); then the row-wise GEMM
        a_codes, a_scale, w_codes, w_scale = quantize_pair_triton(x2d, weight.source)
        if w_codes is None:
            w_codes_t, w_scale = weight.codes_t, weight.scale_fp32
        else:
            w_codes_t = w_codes.t()
        out = _scaled_mm(a_codes, a_scale, w_codes_t, w_scale, bias, x.dtype, settings.fast_accum)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])
    else:
        # the stats buffer is the stream's own (gemm_stats): no allocation and no select per call
        a_codes, a_scale = quantize_dynamic(x2d, scratch=gemm_stats(x.device))
    out = _scaled_mm(a_codes, a_scale, weight.codes_t, weight.scale_fp32, bias, x.dtype,
                     settings.fast_accum and not weight.static_input)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])
