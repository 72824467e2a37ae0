"""FP8 attention through cuDNN's FP8 SDPA (nvidia-cudnn-frontend's graph API): issue 28's `fp8` mode on sm_90+,
beside the project's own Triton kernel (attention_fp8.py); the attention family measures both once per shape and
runs the faster (see integration/).

Layout: q `[B, H, Sq, D]`, k and v `[B, H, Skv, D]`, D in {64, 128}, bf16 or fp16, non-causal, no mask; the
output is contiguous `[B, H, Sq, D]` in q's dtype.

Quantisation, all on the GPU (no host read of any value):
- q, k and v each get one e4m3 scale per tensor, amax / 448, handed to cuDNN as its descale tensors (device
  pointers). k is smoothed first (the mean over its tokens subtracted per batch and head, SageAttention's trick:
  softmax is invariant to it, so only the rounding changes).
- P, in [0, 1] inside cuDNN, is scaled by 448 into e4m3 (`scale_s`) and back (`descale_s`).
- The output is written in q's dtype where this cuDNN takes that; otherwise in e4m3 with `scale_o` = 1 / v's
  scale (every output row is a convex combination of v's rows, so |o| <= amax(v)) and dequantised after.

Options (`Fp8Options`; issue 38, item 3), both off by default (`PLAIN`, the quantisation above in eager torch ops):
- `rotate`: q and k rotated by the normalised Hadamard matrix before their codes (FlashAttention-3's incoherent
  processing: Q K^T is unchanged by a common orthogonal rotation, and DiT's few large channels are spread over all
  D, so the per-tensor e4m3 scale stops following them);
- `v_mean`: V's token mean m_v subtracted before its codes and added to the output after cuDNN (`add_value_mean`:
  every output row is a convex combination of V's rows, so P (V - m_v) + m_v = P V exactly; the e4m3 output's
  bound holds for V - m_v alike). It costs a mean of V and one pass over the output.
With either on, q, k and v are quantised by ops/rotate_quantize_fp8.py: two Triton launches after K's (and V's)
token mean, scales on the GPU (its module says why two), codes bit-identical to its eager reference, which runs
instead off an FP8 GPU or with `fused=False` (the eager-rotation variant, kept as the reference). `ROTATED` is the
variant the `fp8` mode may offer (integration/attention_fp8.py: only under the yardstick).

One graph per shape, built on its first call (an eager call: ComfyUI's model compiler runs each block eagerly once
before it captures it) and cached with its workspace; a later call allocates the codes and the output alike every
time and reads nothing back to the host, so a block replayed from a CUDA graph runs it unchanged.

`refusal(q, k, v, mask)` says why it cannot take a call (None when it can); callers fall back to exact attention.
The rotated path's cuDNN graph is the plain one (same shapes and formats: only the codes differ), cached alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import rotate_quantize_fp8 as rotation

try:
    import cudnn
    IMPORT_ERROR = None
except Exception as exc:  # not installed, or no libcudnn to load: the family says so once and stays exact
    cudnn = None
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"[:160]

OP = "attention_cudnn_fp8"
FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0
ABSMAX_FLOOR = 1e-12
MIN_CAPABILITY = (9, 0)
HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)


def refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> str | None:
    """Why cuDNN's FP8 SDPA cannot take this call, or None."""
    if cudnn is None:
        return f"nvidia-cudnn-frontend is not importable ({IMPORT_ERROR})"
    if mask is not None:
        return "an attention mask (cuDNN's FP8 SDPA here runs unmasked attention only)"
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return "tensors not on a CUDA device"
    if torch.cuda.get_device_capability(q.device) < MIN_CAPABILITY:
        return f"GPU capability {torch.cuda.get_device_capability(q.device)} below {MIN_CAPABILITY}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not [B, H, S, D] tensors"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (bf16 or fp16 only)"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dim {q.shape[-1]} (only {HEAD_DIMS})"
    return None


def per_tensor_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes of x, contiguous; its fp32 scale as a [1, 1, 1, 1] GPU tensor): scale = amax / 448."""
    scale = (x.abs().amax().float().clamp_min(ABSMAX_FLOOR) / E4M3_MAX).reshape(1, 1, 1, 1)
    codes = (x * scale.reciprocal().to(x.dtype)).to(FP8_DTYPE).contiguous()
    return codes, scale


@dataclass(frozen=True)
class Fp8Options:
    """How q, k and v become cuDNN's operands (see the module): rotation of q and k, V's mean, and whether the
    Triton quantiser runs (False: its eager reference)."""
    rotate: bool = False
    v_mean: bool = False
    fused: bool = True


PLAIN = Fp8Options()
ROTATED = Fp8Options(rotate=True)


def operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Fp8Options = PLAIN
             ) -> rotation.RotatedCodes:
    """The codes, descales and V's mean (or None) that cuDNN's graph takes for (q, k, v) under `options`."""
    if options.rotate or options.v_mean:
        quantize = rotation.rotate_quantize if options.fused else rotation.rotate_quantize_reference
        return quantize(q, k, v, rotate=options.rotate, v_mean=options.v_mean)
    q8, sq = per_tensor_codes(q)
    k8, sk = per_tensor_codes(k - k.mean(dim=-2, keepdim=True))
    v8, sv = per_tensor_codes(v)
    return rotation.RotatedCodes(q8, k8, v8, sq, sk, sv, None)


def add_value_mean(out: torch.Tensor, v_mean: torch.Tensor | None) -> torch.Tensor:
    """cuDNN's P (V - m_v) plus m_v (fp32 `[B, H, 1, D]`), in place, rounded once to out's dtype: P V (the rows of
    P sum to one). Without a mean, out as it is."""
    return out if v_mean is None else out.add_(v_mean)


@dataclass
class _Plan:
    """A built cuDNN graph for one shape: its tensor descriptors by name, workspace and constant scales."""
    graph: object
    handle: object
    tensors: dict
    workspace: torch.Tensor
    constants: dict
    fp8_output: bool


_HANDLES: dict[int, object] = {}
_PLANS: dict[tuple, _Plan] = {}


def _handle(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _HANDLES:
        _HANDLES[index] = cudnn.create_handle()
    return _HANDLES[index]


def _sdpa_fp8(graph, named: dict, attn_scale: float):
    """graph.sdpa_fp8 with inference set, under either spelling of this frontend's versions."""
    args = {key: named[key] for key in ("q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s",
                                        "scale_s", "scale_o")}
    try:
        return graph.sdpa_fp8(**args, generate_stats=False, attn_scale=attn_scale, use_causal_mask=False)
    except TypeError:
        return graph.sdpa_fp8(**args, is_inference=True, attn_scale=attn_scale, use_causal_mask=False)


def _build(q: torch.Tensor, k: torch.Tensor, fp8_output: bool) -> _Plan:
    handle = _handle(q.device)
    fp8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    out_type = fp8 if fp8_output else (cudnn.data_type.BFLOAT16 if q.dtype == torch.bfloat16
                                       else cudnn.data_type.HALF)
    graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32, compute_data_type=f32, handle=handle)

    def contiguous(shape):
        return list(shape), [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1]

    named = {}
    for name, shape in (("q", q.shape), ("k", k.shape), ("v", k.shape)):
        dim, stride = contiguous(shape)
        named[name] = graph.tensor(name=name, dim=dim, stride=stride, data_type=fp8)
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        named[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
    o, _stats, amax_s, amax_o = _sdpa_fp8(graph, named, 1.0 / math.sqrt(q.shape[-1]))
    dim, stride = contiguous(q.shape)
    o.set_output(True).set_dim(dim).set_stride(stride).set_data_type(out_type)
    for amax in (amax_s, amax_o):
        amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    named.update(o=o, amax_s=amax_s, amax_o=amax_o)
    device = q.device
    constants = {"descale_s": torch.full((1, 1, 1, 1), 1.0 / E4M3_MAX, device=device),
                 "scale_s": torch.full((1, 1, 1, 1), E4M3_MAX, device=device),
                 "scale_o": torch.ones((1, 1, 1, 1), device=device),
                 "amax_s": torch.zeros((1, 1, 1, 1), device=device),
                 "amax_o": torch.zeros((1, 1, 1, 1), device=device)}
    workspace = torch.empty(max(graph.get_workspace_size(), 1), device=device, dtype=torch.uint8)
    return _Plan(graph, handle, named, workspace, constants, fp8_output)


def plan_for(q: torch.Tensor, k: torch.Tensor) -> _Plan:
    """The cached graph for this shape, built on the first call (output in q's dtype where cuDNN builds it, else
    e4m3); raises what cuDNN raised when neither builds."""
    key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device)
    if key not in _PLANS:
        try:
            _PLANS[key] = _build(q, k, fp8_output=False)
        except Exception:
            _PLANS[key] = _build(q, k, fp8_output=True)
    return _PLANS[key]


def attention_cudnn_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Fp8Options = PLAIN
                        ) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v with e4m3 operands through cuDNN (the caller checked `refusal`)."""
    plan = plan_for(q, k)
    codes = operands(q, k, v, options)
    return add_value_mean(execute(plan, codes, q.dtype), codes.v_mean)


def execute(plan: _Plan, codes: rotation.RotatedCodes, dtype: torch.dtype) -> torch.Tensor:
    """cuDNN's FP8 SDPA on quantised operands: P (V - m_v) in `dtype` (the mean is the caller's to add)."""
    q8 = codes.q
    out = torch.empty(q8.shape, device=q8.device, dtype=FP8_DTYPE if plan.fp8_output else dtype)
    scale_o = codes.v_scale.reciprocal() if plan.fp8_output else plan.constants["scale_o"]
    t = plan.tensors
    pack = {t["q"]: q8, t["k"]: codes.k, t["v"]: codes.v, t["o"]: out,
            t["descale_q"]: codes.q_scale, t["descale_k"]: codes.k_scale, t["descale_v"]: codes.v_scale,
            t["descale_s"]: plan.constants["descale_s"], t["scale_s"]: plan.constants["scale_s"],
            t["scale_o"]: scale_o, t["amax_s"]: plan.constants["amax_s"], t["amax_o"]: plan.constants["amax_o"]}
    cudnn.set_stream(handle=plan.handle, stream=torch.cuda.current_stream(q8.device).cuda_stream)
    plan.graph.execute(pack, plan.workspace, handle=plan.handle)
    if plan.fp8_output:
        return out.to(dtype) * codes.v_scale.to(dtype)
    return out
