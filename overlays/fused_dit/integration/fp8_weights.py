"""FP8 linears on weights ComfyUI casts per call: DynamicVRAM, low VRAM, LoRA functions, its quantized layers.

`fp8_modules` runs the FP8 GEMM on a weight that sits on the input's device as a plain tensor. ComfyUI's 2026
weight system often hands a Linear no such weight until the call:
- DynamicVRAM (`ModelPatcherDynamic`, main.py's default on NVIDIA since 0.13): weights stay in host memory and are
  streamed to the GPU on demand; every module has `comfy_cast_weights` set, LoRA rides `weight_lowvram_function`;
- the legacy ModelPatcher's low-VRAM mode, and LoRA applied on the fly (`weight_function` / `bias_function`);
- quantized checkpoints (fp8 and others) load as mixed-precision ops whose weight is a comfy-kitchen
  `QuantizedTensor` (codes and a `scale`); they are not `nn.Linear`.
In each case ComfyUI's own op forward gets its weight from the cast function of the ops module that defines it
(`comfy.ops.cast_bias_weight`, with `uncast_bias_weight` after the GEMM since 0.8): it streams the weight in,
applies LoRA and the weight functions and gives back a tensor on the input's device. `cast_call_for` and
fp8_modules.cast_forward make the same call for the FP8 path, so nothing of ComfyUI's streaming, offload or LoRA is
bypassed:
- the cast gives a QuantizedTensor of ComfyUI's per-tensor e4m3 layout (its fp8 checkpoint, LoRA already requantised
  into it by the cast): its codes and scale go to torch._scaled_mm as they are; the activations get the overlay's
  dynamic per-tensor scale;
- the cast gives a plain bf16/fp16/fp32 weight (with LoRA and weight functions applied by ComfyUI): it is quantised
  for this call only (op 5) and dropped after the GEMM, so no second copy of any weight stays on the GPU.
With the node's `fp8_weights` codes_beside_weights under DynamicVRAM (families.RESIDENT_CODES,
`keep_resident_codes`), a weight DynamicVRAM holds resident (the cast hands back comfy-aimdo's `_v_weight` itself,
no LoRA or weight function on the module) keeps its codes between calls, keyed by that tensor and its vbar
signature: no quantisation per call, one byte per parameter more on the GPU beside aimdo's weights. Anything else,
or a module that gets a LoRA, drops them.
Everything else runs the op's own forward, said once (logger `fused_dit`): other layouts (nvfp4, mxfp8, int8),
ComfyUI's full-precision or forced-cast flags, AWQ `pre_quant_scale`, inputs the FP8 GEMM cannot take. The pack's
own `fp8_codes.Fp8CodesLinear` keeps its own forward (its weight functions see the codes' values).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import dispatch
from ..ops import fp8_linear as op
from ..ops.quantize_fp8 import FP8_DTYPE, FP8_MIN_CAPABILITY
from . import model_compiler
from .fp8_codes import Fp8CodesLinear

OP = op.OP
STOCK_THROUGH_CAST = "stock forward (cast seam)"
# comfy-kitchen / ComfyUI layout names of a per-tensor e4m3 weight (comfy/quant_ops.py since 0.8)
FP8_LAYOUTS = frozenset({"TensorCoreFP8Layout", "TensorCoreFP8E4M3Layout"})
PLAIN_WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class CastSeam:
    """ComfyUI's cast functions for one op class, and which arguments they take in that release."""
    cast: Callable                 # cast_bias_weight(s, input, dtype, device, bias_dtype, ...)
    uncast: Callable | None        # uncast_bias_weight(s, weight, bias, offload_stream), 0.8 onward
    offloadable: bool              # cast takes offloadable= and then returns (weight, bias, offload_stream)
    requant: bool                  # cast takes compute_dtype= / want_requant= (0.24 onward)
    quantized_type: type | None    # the QuantizedTensor class that namespace uses, when it has one


def _namespace_of(cls: type) -> dict | None:
    method = getattr(cls, "forward_comfy_cast_weights", None)
    namespace = getattr(method, "__globals__", None)
    if namespace is None and cls.__module__ in sys.modules:
        namespace = vars(sys.modules[cls.__module__])
    return namespace


@functools.lru_cache(maxsize=64)
def cast_seam_of(cls: type) -> CastSeam | None:
    """The cast seam of a ComfyUI op class (found through its forward_comfy_cast_weights' module), else None."""
    namespace = _namespace_of(cls)
    cast = None if namespace is None else namespace.get("cast_bias_weight")
    if not callable(cast):
        return None
    try:
        parameters = inspect.signature(cast).parameters
    except (TypeError, ValueError):
        return None
    if not {"s", "input", "dtype", "device", "bias_dtype"} <= set(parameters):
        return None
    quantized = namespace.get("QuantizedTensor")
    uncast = namespace.get("uncast_bias_weight")
    return CastSeam(cast=cast, uncast=uncast if callable(uncast) else None,
                    offloadable="offloadable" in parameters,
                    requant={"compute_dtype", "want_requant"} <= set(parameters),
                    quantized_type=quantized if isinstance(quantized, type) else None)


def is_comfy_linear_op(module: torch.nn.Module) -> bool:
    """A ComfyUI Linear op, nn.Linear or not (mixed-precision ops' Linear is a plain nn.Module): it casts its weight
    through forward_comfy_cast_weights and has Linear's features."""
    return (hasattr(type(module), "forward_comfy_cast_weights") and isinstance(getattr(module, "in_features", None), int)
            and isinstance(getattr(module, "out_features", None), int) and "weight" in module._parameters)


def quantized_layout(weight) -> str | None:
    """The layout name of a QuantizedTensor-like weight (its `_layout_cls`, a name in ComfyUI's registry), else None."""
    layout = getattr(weight, "_layout_cls", None)
    if layout is None:
        return None
    return layout if isinstance(layout, str) else getattr(layout, "__name__", str(layout))


def fp8_codes_and_scale(weight, out_features: int, in_features: int):
    """(codes [N, K] e4m3, fp32 0-dim scale) of a per-tensor e4m3 QuantizedTensor, or (None, why not)."""
    layout = quantized_layout(weight)
    if layout not in FP8_LAYOUTS:
        return None, f"quantized layout {layout} (the FP8 path reads per-tensor e4m3 only)"
    codes = getattr(weight, "_qdata", None)
    scale = getattr(getattr(weight, "_params", None), "scale", None)
    if not isinstance(codes, torch.Tensor) or not isinstance(scale, torch.Tensor):
        return None, f"{layout} without _qdata / _params.scale tensors"
    if codes.dtype != FP8_DTYPE or tuple(codes.shape) != (out_features, in_features) or scale.numel() != 1:
        return None, (f"{layout} codes {codes.dtype}{tuple(codes.shape)} with a scale of {scale.numel()} "
                      f"elements (expected e4m3 [{out_features}, {in_features}] and one scale)")
    return codes, scale.reshape(()).float()


def static_decline(module: torch.nn.Module, x: torch.Tensor) -> str | None:
    """Why the cast seam must leave this call to the op's own forward, from what is known before casting."""
    if isinstance(module, Fp8CodesLinear):
        return "the pack's own FP8 codes Linear keeps its forward for cast weights"
    if not is_comfy_linear_op(module):
        return f"{type(module).__name__} has no ComfyUI cast (forward_comfy_cast_weights)"
    seam = cast_seam_of(type(module))
    if seam is None:
        return f"{type(module).__name__}: its ops module has no cast_bias_weight this seam knows"
    if torch.is_grad_enabled() and (x.requires_grad or any(
            p is not None and p.requires_grad for p in (module._parameters.get("weight"),
                                                         module._parameters.get("bias")))):
        return "autograd records this call"
    if x.dtype not in op.SUPPORTED_ACTIVATION_DTYPES:
        return f"input dtype {x.dtype} (FP8 GEMM output needs bf16/fp16)"
    if module.in_features % 16 or module.out_features % 16:
        return f"features {module.in_features}x{module.out_features} not divisible by 16 (torch._scaled_mm)"
    for flag, why in (("_full_precision_mm", "ComfyUI runs this layer in full precision"),
                      ("comfy_force_cast_weights", "ComfyUI forces a cast of this layer"),
                      ("pre_quant_scale", "AWQ pre_quant_scale smoothing")):
        if getattr(module, flag, None) not in (None, False):
            return why
    weight = module._parameters.get("weight")
    layout = quantized_layout(weight)
    if layout is not None:
        if seam.quantized_type is None or not isinstance(weight, seam.quantized_type):
            return f"weight {type(weight).__name__} is not the QuantizedTensor of {type(module).__name__}'s ops"
        if layout not in FP8_LAYOUTS:
            return f"quantized layout {layout} (the FP8 path reads per-tensor e4m3 only)"
    elif weight is not None and weight.dtype not in PLAIN_WEIGHT_DTYPES:
        return f"weight dtype {weight.dtype}"
    choice = dispatch.choose(OP, x, min_capability=FP8_MIN_CAPABILITY)
    return None if choice.triton else choice.reason


def cast_call_for(module: torch.nn.Module, x: torch.Tensor) -> tuple[CastSeam, dict] | None:
    """(the op's cast seam, the arguments to give it) for the FP8 forward through ComfyUI's cast on inputs like x,
    or None (said once why) where the op's own forward must run. Worked out once per plan (fp8_modules), whose
    `cast_forward` makes each call."""
    reason = static_decline(module, x)
    if reason is not None:
        dispatch.say_once(OP, STOCK_THROUGH_CAST, reason)
        return None
    seam = cast_seam_of(type(module))
    quantized = quantized_layout(module._parameters.get("weight")) is not None
    return seam, cast_arguments(seam, x.dtype, quantized)


def cast_arguments(seam: CastSeam, dtype: torch.dtype, quantized: bool) -> dict:
    """The keyword arguments ComfyUI's own Linear forwards give that release's cast (made once per plan): a plain
    weight is cast as disable_weight_init.Linear casts it; a quantized one as the mixed-precision Linear does for
    a quantized input (LoRA computed in the input's dtype and requantised into the layout)."""
    kwargs = {}
    if seam.offloadable:
        kwargs["offloadable"] = True
    if seam.requant and quantized:
        kwargs.update(compute_dtype=dtype, want_requant=True)
    return kwargs


_KEEP_RESIDENT_CODES: contextvars.ContextVar[bool] = contextvars.ContextVar("fused_dit_keep_resident_codes",
                                                                         default=False)
RESIDENT_CODES_ATTR = "_fused_dit_resident_codes"


@contextlib.contextmanager
def keep_resident_codes(keep: bool = True):
    """For the calls inside: keep the codes of weights DynamicVRAM holds resident (the node's fp8_weights
    codes_beside_weights, set around each model call)."""
    token = _KEEP_RESIDENT_CODES.set(keep)
    try:
        yield
    finally:
        _KEEP_RESIDENT_CODES.reset(token)


def keeping_resident_codes() -> bool:
    """Whether the calls now keep the codes of resident weights (codes_beside_weights under DynamicVRAM)."""
    return _KEEP_RESIDENT_CODES.get()


def fp8_weight(codes: torch.Tensor, scale: torch.Tensor) -> op.Fp8Weight:
    return op.Fp8Weight(codes=codes, scale=scale, static_input=False, input_scale=None, source_key=())


def resident_codes(module: torch.nn.Module, weight: torch.Tensor,
                   dtype: torch.dtype = torch.bfloat16) -> op.Fp8Weight | None:
    """The FP8 weight (codes, scale and the GEMM's operands derived from them) kept for the resident weight the
    cast handed back, quantised on the first call (row-wise for activations of `dtype` where that fits, as the
    per-call codes are: the same bits either way); None where nothing may be kept (not asked, not aimdo's resident
    tensor, LoRA or weight functions on the module), and then codes kept before are dropped."""
    attrs = module.__dict__
    if not _KEEP_RESIDENT_CODES.get():
        return None
    if (weight is not attrs.get("_v_weight") or attrs.get("weight_lowvram_function") is not None
            or attrs.get("bias_lowvram_function") is not None or getattr(module, "weight_function", None)
            or getattr(module, "bias_function", None)):
        attrs.pop(RESIDENT_CODES_ATTR, None)
        return None
    rowwise = op.rowwise_fits(dtype)
    key = (id(weight), weight.data_ptr(), weight.dtype, tuple(weight.shape), weight.device,
           id(attrs.get("_v_signature")), rowwise)
    kept = attrs.get(RESIDENT_CODES_ATTR)
    if kept is not None and kept[0] == key:
        return kept[1]
    if model_compiler.capturing(weight):    # codes kept must not live in a CUDA graph's pool: per-call codes
        return None
    with model_compiler.outside_recorded_allocations():      # kept between calls: outside the compiler's record
        kept = model_compiler.kept(fp8_weight(*(op.quantize_weight_fp8_rows(weight) if rowwise
                                                 else op.quantize_weight_fp8(weight))))
    attrs[RESIDENT_CODES_ATTR] = (key, kept)
    return kept
