"""Op 6: FP8 linear layers through torch._scaled_mm, a drop-in forward for ComfyUI's Linear modules.

Two weight sources:
- bf16/fp16 weights: quantised once to e4m3 with a per-tensor scale (absmax/448, op 5) and cached on the module,
  keyed by the weight tensor's identity, storage, device and version counter, so a ModelPatcher that swaps or
  edits a weight (LoRA baking, offload/reload) gets a fresh quantisation. Activations use op 5's dynamic
  per-tensor scale, and the GEMM uses Hopper's fast FP8 accumulation (FAST_ACCUM). (Row-wise scales are not
  offered: _scaled_mm's row-wise mode needs row-wise activation scales as well, which op 5 does not produce.)
- float8_e4m3fn weights (ComfyUI's fp8 checkpoints, `scale_weight`/`scale_input` attributes): the module's own
  codes and scales, with ComfyUI's static activation semantics (unit or static scale, in-place clamp): the same
  _scaled_mm call as ComfyUI's fp8_linear, with the input quantisation fused into one kernel.

ComfyUI's `weight_function` / `bias_function` (LoRA patches applied on the fly, low-VRAM casts): when either list is
non-empty the FP8 forward DECLINES and the module's stock forward runs, so those functions keep their exact
semantics; the reason is logged once. Also declined: training mode, inputs that are not bf16/fp16, K or N not
divisible by 16, a weight on another device than the input (low-VRAM offload).

Per-call cost: the module forwards keep a `Fp8Plan` per module (the decline decision, the FP8 weight, the bias in
the activation dtype) keyed by everything that decision reads: the weight and bias tensors' identity, storage,
device, dtype and version counter, the input's device and dtype, training mode, whether weight_function /
bias_function are empty, and the backend environment. A hit costs one tuple comparison and then goes straight to
the quantisation kernel and torch._scaled_mm, without re-running the checks or dispatch.

Weight storage: by default the FP8 codes are held beside the module's bf16 weight (1 byte per parameter more on
the GPU). `store_fp8_only` moves the bf16 weight to host memory once its codes exist, so the GPU holds 1 byte per
parameter instead of 2 (scripts: `fused_dit.enable(model, fp8_weights="replace")`); `restore_stored_weight` moves
it back. While it is away, a call the FP8 forward declines runs the stock forward with the weight brought back to
the GPU for that call (slow, logged).

GEMM constraints (FACTS.md): 2-D operands, first row-major, second column-major (`W8.t()`), fp32 scales, bias in
the output dtype, sm_89+. Below sm_89 or on CPU the FP8 forward declines too (dispatch logs the reason); the
function `linear_fp8` itself then emulates the GEMM in fp32 from the dequantised codes, which CPU tests use to
check the quantisation and reshaping logic.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import dispatch
# imported here, not inside ffn_forward_fp8: a function-level import costs microseconds on every FFN call
from .gelu_quantize_fp8 import gelu_quantize_comfy_triton, gelu_quantize_dynamic_triton
from .quantize_fp8 import (FP8_DTYPE, FP8_MIN_CAPABILITY, fp8_choice, quantize_comfy_triton, quantize_dynamic_triton,
                           quantize_fp8_comfy, quantize_fp8_dynamic)

OP = "fp8_linear"
# Hopper's fast FP8 accumulation (`use_fast_accum`) for the overlay's own dynamic-scale path; ComfyUI's fp8
# checkpoints (static input scale) keep ComfyUI's exact `_scaled_mm` call. benchmarks/blocks.py times both and
# reports the relative Frobenius error of each against the bf16 linear.
FAST_ACCUM = True
_CACHE_ATTR = "_fused_dit_fp8_weight"
_PLAN_ATTR = "_fused_dit_fp8_plan"
_STORED_ATTR = "_fused_dit_fp8_stored"
SUPPORTED_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Fp8Weight:
    codes: torch.Tensor          # [N, K] float8_e4m3fn, row-major; the GEMM reads codes.t() (column-major)
    scale: torch.Tensor          # fp32 0-dim
    static_input: bool           # True: ComfyUI fp8 module (static/unit input scale); False: dynamic activations
    input_scale: torch.Tensor | None
    source_key: tuple
    # derived once here rather than on every call: the GEMM's column-major operand and fp32 scales
    codes_t: torch.Tensor = field(init=False, repr=False, compare=False)
    scale_fp32: torch.Tensor = field(init=False, repr=False, compare=False)
    activation_scale: torch.Tensor | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "codes_t", self.codes.t())
        object.__setattr__(self, "scale_fp32", self.scale.float())
        static_scale = None
        if self.static_input:
            static_scale = (torch.ones((), device=self.codes.device, dtype=torch.float32)
                            if self.input_scale is None else self.input_scale.float())
        object.__setattr__(self, "activation_scale", static_scale)


def quantize_weight_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3 codes [N, K] and fp32 0-dim scale for a bf16/fp16/fp32 weight."""
    codes, scale = quantize_fp8_dynamic(weight.detach())
    return codes.contiguous(), scale


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
    # emulation for CPUs and older GPUs: the same codes and scales, fp32 accumulation
    a = a_codes.float() * a_scale.float()
    w = w_codes.float() * w_scale.float()
    out = a @ w.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def linear_fp8(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None,
               clamp_input_in_place: bool = True) -> torch.Tensor:
    """F.linear with FP8 operands: x [..., K] -> [..., N] in x's dtype."""
    k = x.shape[-1]
    x2d = x.reshape(-1, k)
    if weight.static_input:
        a_codes = quantize_fp8_comfy(x2d, weight.input_scale, clamp_input_in_place=clamp_input_in_place)
        a_scale = weight.activation_scale
    else:
        a_codes, a_scale = quantize_fp8_dynamic(x2d)
    out = matmul_fp8(a_codes.reshape(-1, k), a_scale.to(x.device), weight.codes, weight.scale, bias, x.dtype,
                     fast_accum=FAST_ACCUM and not weight.static_input)
    return out.reshape(*x.shape[:-1], weight.codes.shape[0])


def _linear_fp8_gpu(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """linear_fp8 once a plan has established that the Triton kernels and torch._scaled_mm run for x.

    The same kernels and GEMM call as linear_fp8's dispatched path, without asking dispatch again; bias is
    already in x's dtype and on x's device.
    """
    return _quantized_gemm(x, weight, bias, quantize_comfy_triton, quantize_dynamic_triton)


def _quantized_gemm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None, quantize_static,
                    quantize_dynamic) -> torch.Tensor:
    """x [..., K] quantised by the given Triton quantisers (ComfyUI's static scale when the weight carries one, else
    dynamic per-tensor), then one torch._scaled_mm: [..., N] in x's dtype."""
    x2d = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if weight.static_input:
        a_codes = quantize_static(x2d, weight.input_scale)
        a_scale = weight.activation_scale
    else:
        a_codes, a_scale = quantize_dynamic(x2d)
    out = _scaled_mm(a_codes, a_scale, weight.codes_t, weight.scale_fp32, bias, x.dtype,
                     FAST_ACCUM and not weight.static_input)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])


def decline_reason(module: torch.nn.Module, x: torch.Tensor) -> str | None:
    """Why this module's FP8 forward must not run for input x (None: it may)."""
    if getattr(module, "weight_function", None) or getattr(module, "bias_function", None):
        return "ComfyUI weight_function/bias_function present (LoRA or low-VRAM cast): stock forward keeps them"
    if module.training:
        return "module in training mode"
    if x.dtype not in SUPPORTED_ACTIVATION_DTYPES:
        return f"input dtype {x.dtype} (FP8 GEMM output needs bf16/fp16)"
    weight = module.weight
    if weight_device(module) != x.device:
        return f"weight on {weight.device}, input on {x.device} (offloaded weights: stock forward casts them)"
    n, k = weight.shape
    if k % 16 or n % 16:
        return f"weight shape {tuple(weight.shape)} not divisible by 16 (torch._scaled_mm)"
    if weight.dtype != FP8_DTYPE and weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"weight dtype {weight.dtype}"
    choice = dispatch.choose(OP, x, min_capability=FP8_MIN_CAPABILITY)
    if not choice.triton:
        return choice.reason
    return None


def _tensor_key(tensor: torch.Tensor | None) -> tuple:
    """What identifies a parameter's current contents: identity, storage, device, in-place edits, dtype."""
    if tensor is None:
        return ()
    return (id(tensor), tensor.data_ptr(), tensor.device, tensor._version, tensor.dtype)


@dataclass(frozen=True)
class StoredWeight:
    """A module whose bf16 weight store_fp8_only moved to host memory."""
    device: torch.device     # where the weight lived, and where its FP8 codes are
    key: tuple               # _tensor_key of the weight right after the move: still equal, the codes are its own


def _stored_intact(module: torch.nn.Module) -> StoredWeight | None:
    """The module's StoredWeight while its weight is exactly what store_fp8_only left on the host, else None."""
    stored = module.__dict__.get(_STORED_ATTR)
    if stored is not None and stored.key == _tensor_key(module.weight):
        return stored
    return None


def weight_device(module: torch.nn.Module) -> torch.device:
    """The device the module's weight counts as on: its own, or where its FP8 codes are while it is stored."""
    stored = _stored_intact(module)
    return module.weight.device if stored is None else stored.device


def fp8_weight_of(module: torch.nn.Module) -> Fp8Weight:
    """The module's FP8 weight, quantised on first use and re-quantised when the weight tensor changes."""
    weight = module.weight
    key = _tensor_key(weight)
    cached = module.__dict__.get(_CACHE_ATTR)
    if cached is not None and (cached.source_key == key or _stored_intact(module) is not None):
        return cached
    if weight.dtype == FP8_DTYPE:
        scale_weight = getattr(module, "scale_weight", None)
        scale_input = getattr(module, "scale_input", None)
        fresh = Fp8Weight(
            codes=weight.detach(),
            scale=(torch.ones((), device=weight.device, dtype=torch.float32) if scale_weight is None
                   else scale_weight.detach().to(weight.device, torch.float32)),
            static_input=True,
            input_scale=None if scale_input is None else scale_input.detach().to(weight.device, torch.float32),
            source_key=key)
    else:
        codes, scale = quantize_weight_fp8(weight)
        fresh = Fp8Weight(codes=codes, scale=scale, static_input=False, input_scale=None, source_key=key)
    module.__dict__[_CACHE_ATTR] = fresh
    return fresh


def drop_fp8_cache(module: torch.nn.Module) -> None:
    """Forget the module's FP8 codes and plan (a stored weight is moved back first: the codes are its copy)."""
    restore_stored_weight(module)
    module.__dict__.pop(_CACHE_ATTR, None)
    module.__dict__.pop(_PLAN_ATTR, None)


def store_fp8_only(module: torch.nn.Module, host: torch.device = torch.device("cpu")) -> int:
    """Quantise the module's weight now and move the original to `host`; returns the bytes that left the GPU.

    0, and nothing moved, where the FP8 forward could not use the codes (decline_reason for an input of the
    weight's dtype on its device: CPU weights, GPUs below sm_89, weight functions, shapes, training) or the weight
    is stored already / already FP8 (then the codes are the weight itself).
    """
    weight = module.weight
    if _STORED_ATTR in module.__dict__ or weight.dtype == FP8_DTYPE or weight.device.type != "cuda":
        return 0
    probe_dtype = weight.dtype if weight.dtype in SUPPORTED_ACTIVATION_DTYPES else torch.bfloat16
    if decline_reason(module, weight.new_empty((0, weight.shape[-1]), dtype=probe_dtype)) is not None:
        return 0
    fp8_weight_of(module)
    device, freed = weight.device, weight.numel() * weight.element_size()
    weight.data = weight.detach().to(host)
    module.__dict__[_STORED_ATTR] = StoredWeight(device, _tensor_key(weight))
    module.__dict__.pop(_PLAN_ATTR, None)
    return freed


def restore_stored_weight(module: torch.nn.Module) -> bool:
    """Move a weight store_fp8_only moved back to its device (whatever was done to it meanwhile); True if moved."""
    stored = module.__dict__.pop(_STORED_ATTR, None)
    if stored is None:
        return False
    weight = module.weight
    if weight.device != stored.device:
        weight.data = weight.detach().to(stored.device)
    module.__dict__.pop(_PLAN_ATTR, None)
    return True


def _declined(module: torch.nn.Module, reason: str, stock_forward, x: torch.Tensor) -> torch.Tensor:
    """The stock forward for a call the FP8 path declines; a stored weight visits its device for the call."""
    dispatch.say_once(OP, "stock forward", reason)
    stored = module.__dict__.get(_STORED_ATTR)
    weight = module.weight
    if stored is None or weight.device == stored.device:
        return stock_forward(x)
    dispatch.say_once(OP, "stock forward", "weight stored in host memory: copied to the GPU for this call")
    host = weight.data
    weight.data = host.to(stored.device)
    try:
        return stock_forward(x)
    finally:
        weight.data = host


def module_bias(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else bias.to(device=x.device, dtype=x.dtype)


@dataclass(frozen=True)
class Fp8Plan:
    """One module's decision for inputs of one device and dtype, and what the FP8 path then needs."""
    key: tuple
    decline_reason: str | None
    weight: Fp8Weight | None         # None when declined
    bias: torch.Tensor | None        # in the input's dtype and device


# Per module class: whether `module.weight` / `module.bias` can be read straight from module._parameters. True
# when the class defines neither name itself and keeps nn.Module's attribute lookup, so the dict read finds what
# the attribute read would (nn.Module.__setattr__ keeps registered parameters out of the instance __dict__);
# nn.Module.__getattr__ costs about a microsecond per read, and the plan key reads both on every call.
_PARAMETERS_READABLE: dict[type, bool] = {}


def _parameters_readable(cls: type) -> bool:
    readable = _PARAMETERS_READABLE.get(cls)
    if readable is None:
        readable = _PARAMETERS_READABLE[cls] = (
            not hasattr(cls, "weight") and not hasattr(cls, "bias")
            and cls.__getattr__ is torch.nn.Module.__getattr__
            and cls.__getattribute__ is object.__getattribute__)
    return readable


def _environ_reader(name: str):
    """A function returning the current raw value of environment variable `name` (None when unset).

    os.environ.get raises and catches a KeyError inside when the variable is unset (the usual case), about a
    microsecond per call; the mapping behind os.environ answers the same question with one dict lookup. Falls back
    to os.environ.get when os.environ is not the standard mapping (replaced by a test, another interpreter).
    """
    encodekey = getattr(os.environ, "encodekey", None)
    encoded = encodekey(name) if encodekey is not None else None

    def read():
        environ = os.environ
        data = getattr(environ, "_data", None) if type(environ) is os._Environ else None
        if data is None or encoded is None:
            return environ.get(name)
        return data.get(encoded)
    return read


# the raw value (bytes on POSIX) is only compared, never interpreted: equal values, equal keys
_backend_env = _environ_reader("FUSED_DIT_BACKEND")


def fp8_plan_of(module: torch.nn.Module, x: torch.Tensor) -> Fp8Plan:
    """The module's cached plan for x, rebuilt whenever anything decline_reason or the FP8 weight read changes.

    The key holds what _tensor_key gives for the weight and the bias, the input's device and dtype, training mode,
    whether weight_function/bias_function are non-empty and the backend environment; it is built inline because
    it runs on every forward of every FP8 linear (see benchmarks/fp8_host_overhead.py).
    """
    attrs = module.__dict__
    cls = type(module)
    params = attrs.get("_parameters")
    if params is not None and "weight" in params and _parameters_readable(cls):
        weight = params["weight"]
        bias = params["bias"] if "bias" in params else getattr(module, "bias", None)
    else:
        weight = module.weight
        bias = getattr(module, "bias", None)
    functions = attrs.get("weight_function")
    if functions is None:
        functions = getattr(cls, "weight_function", None)
    if not functions:
        functions = attrs.get("bias_function")
        if functions is None:
            functions = getattr(cls, "bias_function", None)
    key = ((id(weight), weight.data_ptr(), weight.device, weight._version, weight.dtype) if weight is not None
           else (),
           (id(bias), bias.data_ptr(), bias.device, bias._version, bias.dtype) if bias is not None else (),
           x.device, x.dtype, attrs["training"] if "training" in attrs else module.training, bool(functions),
           _backend_env())
    plan = attrs.get(_PLAN_ATTR)
    if plan is not None and plan.key == key:
        return plan
    reason = decline_reason(module, x)
    if reason is None:
        plan = Fp8Plan(key, None, fp8_weight_of(module), module_bias(module, x))
    else:
        plan = Fp8Plan(key, reason, None, None)
    attrs[_PLAN_ATTR] = plan
    return plan


def fp8_linear_forward(module: torch.nn.Module, x: torch.Tensor, stock_forward) -> torch.Tensor:
    """Forward for a Linear module: the FP8 path when it may run, else `stock_forward(x)`."""
    plan = fp8_plan_of(module, x)
    if plan.decline_reason is not None:
        return _declined(module, plan.decline_reason, stock_forward, x)
    return _linear_fp8_gpu(x, plan.weight, plan.bias)


def is_linear(module: torch.nn.Module) -> bool:
    """A torch Linear or anything shaped like one (ComfyUI's ops.*.Linear subclass torch.nn.Linear)."""
    return isinstance(module, torch.nn.Linear)


def ffn_forward_fp8(ffn: torch.nn.Sequential, x: torch.Tensor, stock_forward) -> torch.Tensor:
    """Linear -> GELU(tanh) -> Linear with FP8 GEMMs and op 7 (GELU fused into the second GEMM's quantisation)."""
    fc_in, _, fc_out = ffn[0], ffn[1], ffn[2]
    plan_in = fp8_plan_of(fc_in, x)
    if plan_in.decline_reason is not None:
        hidden = _declined(fc_in, plan_in.decline_reason, stock_forward_of(fc_in), x)
    else:
        hidden = _linear_fp8_gpu(x, plan_in.weight, plan_in.bias)
    plan_out = fp8_plan_of(fc_out, hidden)
    if plan_out.decline_reason is not None:
        return _declined(fc_out, plan_out.decline_reason, stock_forward_of(fc_out),
                         F.gelu(hidden, approximate="tanh"))
    return _quantized_gemm(hidden, plan_out.weight, plan_out.bias, gelu_quantize_comfy_triton,
                           gelu_quantize_dynamic_triton)


def is_gelu_tanh_ffn(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.Sequential) and len(module) == 3 and is_linear(module[0])
            and isinstance(module[1], torch.nn.GELU) and module[1].approximate == "tanh" and is_linear(module[2]))


SAVED_FORWARD_ATTR = "_fused_dit_saved_forward"


def stock_forward_of(module: torch.nn.Module):
    """The forward the module had before the overlay replaced it (an earlier instance forward, or its class's)."""
    if SAVED_FORWARD_ATTR in module.__dict__:
        saved = module.__dict__[SAVED_FORWARD_ATTR]
        return saved if saved is not None else type(module).forward.__get__(module)
    return module.forward
