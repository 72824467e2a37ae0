"""FP8 linears as module forwards: which nn.Module may run in FP8, its cached FP8 weight, the stock fallback.

The op itself (`fused_dit.ops.fp8_linear`) takes tensors; this module knows nn.Module, ComfyUI's Linear
attributes and weights:
- bf16/fp16 weights are quantised once and cached on the module, keyed by the weight tensor's identity, storage,
  device and version counter, so a ModelPatcher that swaps or edits a weight (LoRA baking, offload/reload) gets a
  fresh quantisation; ComfyUI's fp8 checkpoints (e4m3 weight, `scale_weight` / `scale_input`) use their own codes.
- The FP8 forward DECLINES, and the module's stock forward runs, when ComfyUI's `weight_function` /
  `bias_function` lists are non-empty (LoRA applied on the fly, low-VRAM casts: those functions keep their exact
  semantics), when autograd records the call (grad mode on and the input, weight or bias requiring grad: the FP8
  path has no backward), for inputs that are not bf16/fp16, K or N not divisible by 16, a weight on another device
  than the input (low-VRAM offload), and where dispatch says the FP8 kernels cannot run (CPU, below sm_89). The
  reason is logged once. Training mode is NOT a reason: ComfyUI 0.3.64 leaves Flux and Wan in training mode for
  the whole generation and samples under torch.inference_mode().

Per-call cost: each module keeps an `Fp8Plan` (the decline decision, the FP8 weight, the bias in the activation
dtype) keyed by everything that decision reads; a hit costs one tuple comparison and then goes straight to the
quantisation kernel and torch._scaled_mm, without re-running the checks or dispatch.

Weight storage: by default the FP8 codes are held beside the module's bf16 weight (1 byte per parameter more on
the GPU). `store_fp8_only` moves the bf16 weight to host memory once its codes exist, so the GPU holds 1 byte per
parameter instead of 2 (`fused_dit.enable(model, fp8_weights="no_extra_memory")`:
families.WEIGHTS_IN_HOST_MEMORY); `restore_stored_weight` moves it back.
While it is away, a call the FP8 forward declines runs the stock forward with the weight brought back to the GPU
for that call (slow, logged). In ComfyUI the node swaps whole modules for `fp8_codes.Fp8CodesLinear` instead
(codes in the weight's place, through ComfyUI's object patches); their e4m3 weights are the overlay's own codes
(`DYNAMIC_INPUT_ATTR`) and take the same path as codes kept alongside.

Under torch.compile the module forwards are one custom op each (`fp8_linear_module`, `fp8_ffn_module`), whose
implementation is the eager forward of this module: Dynamo sees one opaque call taking the input and the module's
slot tensor (`slot_of`), decides the autograd test at trace time (it guards grad mode and requires_grad), and never
traces the plans, the dispatch or the launches.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import dispatch, library
from ..ops import fp8_linear as op
from ..ops.fp8_linear import OP, SUPPORTED_ACTIVATION_DTYPES
from ..ops.quantize_fp8 import FP8_DTYPE, FP8_MIN_CAPABILITY
from ..state import STATE
from . import fp8_shapes, fp8_weights, model_compiler

_CACHE_ATTR = "_fused_dit_fp8_weight"
_PLAN_ATTR = "_fused_dit_fp8_plan"
_STORED_ATTR = "_fused_dit_fp8_stored"
# set (True) on modules whose e4m3 weight holds codes of the overlay's own quantisation (fp8_codes.Fp8CodesLinear):
# their activations get dynamic scales; other e4m3 weights are ComfyUI fp8 checkpoints with its static semantics
DYNAMIC_INPUT_ATTR = "fused_dit_dynamic_input"
_grad_enabled = torch.is_grad_enabled

def autograd_needs_stock(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether autograd would record this call: grad mode on and the input, the weight or the bias requiring grad.

    The FP8 path has no backward, so only then must the stock forward run. Training mode says nothing about it:
    ComfyUI 0.3.64 leaves Flux and Wan in training mode for the whole generation and samples under
    torch.inference_mode(), where grad mode is off.
    """
    return torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))


AUTOGRAD_REASON = "autograd records this call (grad enabled and the input, weight or bias requires grad)"


def decline_reason(module: torch.nn.Module, x: torch.Tensor) -> str | None:
    """Why this module's FP8 forward must not run for input x (None: it may)."""
    weight = getattr(module, "weight", None)
    if weight is None or type(weight) not in (torch.Tensor, torch.nn.Parameter):
        # DynamicVRAM leaves a Linear's weight None until it streams it in; comfy-kitchen's QuantizedTensor is a
        # subclass whose layout the FP8 path does not read: the op's own forward handles both
        return f"weight is {'None' if weight is None else type(weight).__name__}, not a plain tensor"
    if autograd_needs_stock(x, module.weight, getattr(module, "bias", None)):
        return AUTOGRAD_REASON
    if cast_by_comfy(module.__dict__):
        return CAST_REASON
    return storage_decline_reason(module, x)


CAST_REASON = ("ComfyUI casts this weight per call (DynamicVRAM streams it, or LoRA rides weight_lowvram_function): "
               "the weight in place is not the one ComfyUI would use")


def cast_by_comfy(attrs: dict) -> bool:
    """Whether ComfyUI's loader left this module's weight to its cast: DynamicVRAM's vbar slot (`_v`) or a LoRA
    applied to the streamed weight (`weight_lowvram_function` / `bias_lowvram_function`), from the module's
    __dict__. Using the weight in place would drop that LoRA."""
    return ("_v" in attrs or attrs.get("weight_lowvram_function") is not None
            or attrs.get("bias_lowvram_function") is not None)


def storage_decline_reason(module: torch.nn.Module, x: torch.Tensor) -> str | None:
    """decline_reason without the autograd test: whether FP8 codes of this module's weight could serve input x."""
    if getattr(module, "weight_function", None) or getattr(module, "bias_function", None):
        return "ComfyUI weight_function/bias_function present (LoRA or low-VRAM cast): stock forward keeps them"
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


def new_enable_epoch() -> None:
    """Called by every `enable`: weights that keep no version counter may have been edited in place since."""
    STATE.enable_epoch += 1


def _version_of(tensor: torch.Tensor):
    """The tensor's in-place edit counter. Inference tensors keep none (reading `_version` raises), and ComfyUI
    loads and moves weights under torch.inference_mode(), so all its weights are inference tensors: for them the
    enable epoch stands in. ModelPatcher patches weights (LoRA, in place or not) before sampling, never during a
    call, so FP8 codes made since the last enable are still the weight's own."""
    if tensor.is_inference():
        return ("inference", STATE.enable_epoch)
    return tensor._version


def _tensor_key(tensor: torch.Tensor | None, copied: bool = True) -> tuple:
    """What identifies a parameter's current contents: identity, storage, device, in-place edits, dtype.

    copied=False: what the FP8 path keeps of the tensor is a view of its storage (e4m3 codes, a bias already in the
    input's dtype), which sees in-place edits by itself; its edit counter, and for inference tensors the enable
    epoch, are left out, so the plan outlives the node's enable around every model call."""
    if tensor is None:
        return ()
    if type(tensor) not in _PLAIN_TENSOR_TYPES:
        # a tensor subclass such as comfy-kitchen's QuantizedTensor: no storage pointer to read; the FP8 path
        # keeps nothing of it (fp8_weights casts it per call)
        return (id(tensor), type(tensor))
    return (id(tensor), tensor.data_ptr(), tensor.device, _version_of(tensor) if copied else None, tensor.dtype)


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


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


def fp8_weight_of(module: torch.nn.Module) -> op.Fp8Weight:
    """The module's FP8 weight, quantised on first use and re-quantised when the weight tensor changes."""
    weight = module.weight
    key = _tensor_key(weight, weight.dtype != FP8_DTYPE)
    cached = module.__dict__.get(_CACHE_ATTR)
    if cached is not None and (cached.source_key == key or _stored_intact(module) is not None):
        return cached
    if weight.dtype == FP8_DTYPE and getattr(module, DYNAMIC_INPUT_ATTR, False):
        # fp8_codes.Fp8CodesLinear: the overlay's own codes, activations quantised as with the weights alongside
        scale = module.scale_weight.detach().to(weight.device, torch.float32)
        fresh = op.Fp8Weight(codes=weight.detach(), scale=scale, static_input=False, input_scale=None,
                             source_key=key)
    elif weight.dtype == FP8_DTYPE:
        scale_weight = getattr(module, "scale_weight", None)
        scale_input = getattr(module, "scale_input", None)
        fresh = op.Fp8Weight(
            codes=weight.detach(),
            scale=(torch.ones((), device=weight.device, dtype=torch.float32) if scale_weight is None
                   else scale_weight.detach().to(weight.device, torch.float32)),
            static_input=True,
            input_scale=None if scale_input is None else scale_input.detach().to(weight.device, torch.float32),
            source_key=key)
    else:
        codes, scale = op.quantize_weight_fp8(weight)
        fresh = op.Fp8Weight(codes=codes, scale=scale, static_input=False, input_scale=None, source_key=key)
    module.__dict__[_CACHE_ATTR] = fresh
    return fresh


def drop_fp8_cache(module: torch.nn.Module) -> None:
    """Forget the module's FP8 codes and plan (a stored weight is moved back first: the codes are its copy)."""
    restore_stored_weight(module)
    module.__dict__.pop(_CACHE_ATTR, None)
    module.__dict__.pop(_PLAN_ATTR, None)
    module.__dict__.pop(fp8_weights.RESIDENT_CODES_ATTR, None)


def store_fp8_only(module: torch.nn.Module, host: torch.device = torch.device("cpu")) -> int:
    """Quantise the module's weight now and move the original to `host`; returns the bytes that left the GPU.

    0, and nothing moved, where the FP8 forward could not use the codes (storage_decline_reason for an input of
    the weight's dtype on its device: CPU weights, GPUs below sm_89, weight functions, shapes) or the weight is
    stored already / already FP8 (then the codes are the weight itself).
    """
    weight = module.weight
    if _STORED_ATTR in module.__dict__ or weight.dtype == FP8_DTYPE or weight.device.type != "cuda":
        return 0
    probe_dtype = weight.dtype if weight.dtype in SUPPORTED_ACTIVATION_DTYPES else torch.bfloat16
    if storage_decline_reason(module, weight.new_empty((0, weight.shape[-1]), dtype=probe_dtype)) is not None:
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
    weight: op.Fp8Weight | None         # None when declined
    bias: torch.Tensor | None        # in the input's dtype and device
    # declined for the weight in place, but ComfyUI's cast gives one the FP8 GEMM takes (fp8_weights): x -> output
    cast_forward: object = None
    bias_version: object = None        # _version_of the bias `bias` copies (None: not a copy)
    # the fp8_shapes mechanism whose table decides per call whether FP8 runs (None: it always does): codes cached
    # beside a bf16 weight the stock forward can use; weights held only as codes never decline by shape
    shape_mechanism: str | None = None


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

    The key holds what _tensor_key gives for the weight and the bias, the input's device and dtype, whether
    autograd records the call (autograd_needs_stock), whether weight_function/bias_function are non-empty and the
    backend environment; it is built inline because it runs on every forward of every FP8 linear (see
    benchmarks/fp8_host_overhead.py).
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
    dtype = x.dtype
    # the plan keeps a copy of the weight (its quantised codes) only for a bf16/fp16/fp32 weight on x's device or
    # stored in host memory by store_fp8_only: only then must the key see in-place edits
    key = (_tensor_key(weight, weight is not None and weight.dtype != FP8_DTYPE
                       and (weight.device == x.device or _STORED_ATTR in attrs)),
           _tensor_key(bias, False),
           x.device, dtype,
           _grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                or (bias is not None and bias.requires_grad)),
           bool(functions) or cast_by_comfy(attrs), _backend_env())
    # a bias in another dtype is copied into the plan: an in-place edit (or, for inference tensors, a new enable)
    # refreshes that copy alone, not the whole plan (fp32 biases under bf16 inputs, e.g. Wan loaded in fp32)
    bias_version = _version_of(bias) if bias is not None and (bias.dtype != dtype or bias.device != x.device) \
        else None
    plan = attrs.get(_PLAN_ATTR)
    if plan is not None and plan.key == key and plan.bias_version == bias_version:
        return plan
    if model_compiler.capturing(x):
        # what a plan keeps (codes, a bias copy) must not live in a CUDA graph's pool: stock for this call
        return Fp8Plan(key, CAPTURED_FIRST, None, None)
    # what a plan keeps outlives the call: made outside the model compiler's record of per-call allocations
    with model_compiler.outside_recorded_allocations():
        if plan is not None and plan.key == key:        # the bias a plan copies was edited: a new copy
            plan = dataclasses.replace(plan, bias=module_bias(module, x) if plan.weight is not None else None,
                                       bias_version=bias_version)
        else:
            plan = _new_plan(module, x, key, weight, bias_version)
        attrs[_PLAN_ATTR] = model_compiler.kept(plan)
    return plan


CAPTURED_FIRST = "first called inside a CUDA-graph capture (its plan is made on an eager call)"


def _new_plan(module: torch.nn.Module, x: torch.Tensor, key: tuple, weight, bias_version) -> Fp8Plan:
    attrs = module.__dict__
    reason = decline_reason(module, x)
    if reason is None:
        cached_beside = (weight.dtype != FP8_DTYPE and _STORED_ATTR not in attrs
                         and not getattr(module, DYNAMIC_INPUT_ATTR, False))
        return Fp8Plan(key, None, fp8_weight_of(module), module_bias(module, x), bias_version=bias_version,
                       shape_mechanism=fp8_shapes.CACHED if cached_beside else None)
    cast_call = fp8_weights.cast_call_for(module, x) if fp8_weights.is_comfy_linear_op(module) else None
    return Fp8Plan(key, reason, None, None,
                   None if cast_call is None else functools.partial(cast_forward, module, *cast_call))


def fp8_linear_forward(module: torch.nn.Module, x: torch.Tensor, stock_forward) -> torch.Tensor:
    """Forward for a Linear module: the FP8 path when it may run, else `stock_forward(x)`."""
    if library.compiling():
        return _traced_linear_forward(module, x, stock_forward)
    return _run_plan(module, fp8_plan_of(module, x), x, stock_forward)


def _run_plan(module: torch.nn.Module, plan: Fp8Plan, x: torch.Tensor, stock_forward) -> torch.Tensor:
    """One call by the module's plan: the FP8 GEMM (on the weight in place or through ComfyUI's cast), or the stock
    forward where the plan declines or FP8 cannot beat bf16 for this call's rows (fp8_shapes)."""
    if plan.decline_reason is not None:
        if plan.cast_forward is not None:
            mechanism = fp8_shapes.CACHED if fp8_weights.keeping_resident_codes() else fp8_shapes.PER_CALL
            reason = shape_decline(mechanism, x)
            if reason is not None:
                return _declined(module, reason, stock_forward, x)
            return plan.cast_forward(x)
        return _declined(module, plan.decline_reason, stock_forward, x)
    if plan.shape_mechanism is not None:
        reason = shape_decline(plan.shape_mechanism, x)
        if reason is not None:
            return _declined(module, reason, stock_forward, x)
    return op.linear_fp8_triton(x, plan.weight, plan.bias)


def shape_decline(mechanism: str, x: torch.Tensor) -> str | None:
    """fp8_shapes' verdict for this call: rows = x.numel() // K."""
    k = x.shape[-1]
    return fp8_shapes.decline_reason(mechanism, x.numel() // k if k else 0, k)


def cast_forward(module: torch.nn.Module, seam: fp8_weights.CastSeam, kwargs: dict, x: torch.Tensor) -> torch.Tensor:
    """One call through ComfyUI's cast (fp8_weights): the weight from the cast, the FP8 GEMM on it, the uncast after."""
    result = seam.cast(module, x, **kwargs)
    weight, bias, offload_stream = (*result, None) if len(result) == 2 else result
    try:
        if seam.quantized_type is not None and isinstance(weight, seam.quantized_type):
            codes, scale = fp8_weights.fp8_codes_and_scale(weight, module.out_features, module.in_features)
            if codes is None:           # a layout the cast produced that the static check could not see
                dispatch.say_once(OP, fp8_weights.STOCK_THROUGH_CAST, scale)
                return module.forward_comfy_cast_weights(x)
            weight_fp8 = fp8_weights.fp8_weight(codes, scale)
        else:
            # the weight as ComfyUI made it for this call (LoRA and weight functions applied): codes for this call
            # only (row-wise, made in the activation's launch, for bf16), or kept with aimdo's resident weight where
            # asked
            weight_fp8 = fp8_weights.resident_codes(module, weight, x.dtype)
            if weight_fp8 is None:
                weight_fp8 = (op.per_call_weight(weight) if op.rowwise_fits(x.dtype)
                              else fp8_weights.fp8_weight(*op.quantize_weight_fp8(weight)))
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return op.linear_fp8_triton(x, weight_fp8, bias)
    finally:
        if seam.uncast is not None and offload_stream is not None:
            seam.uncast(module, weight, bias, offload_stream)


def linear_overlay(module: torch.nn.Module, stock_forward, x: torch.Tensor) -> torch.Tensor:
    """The overlay forward installed on an FP8 Linear (integration.install_forward hands it the stock forward)."""
    return fp8_linear_forward(module, x, stock_forward)


def ffn_overlay(ffn: torch.nn.Sequential, stock_forward, x: torch.Tensor) -> torch.Tensor:
    """The overlay forward installed on a GELU(tanh) FFN."""
    return ffn_forward_fp8(ffn, x, stock_forward)


def is_linear(module: torch.nn.Module) -> bool:
    """A torch Linear or anything shaped like one (ComfyUI's ops.*.Linear subclass torch.nn.Linear; its
    mixed-precision ops' Linear, holding QuantizedTensor weights, is a Linear-shaped op: fp8_weights)."""
    return isinstance(module, torch.nn.Linear) or fp8_weights.is_comfy_linear_op(module)


def ffn_forward_fp8(ffn: torch.nn.Sequential, x: torch.Tensor, stock_forward) -> torch.Tensor:
    """Linear -> GELU(tanh) -> Linear with FP8 GEMMs and op 7 (GELU fused into the second GEMM's quantisation)."""
    if library.compiling():
        return _traced_ffn_forward(ffn, x, stock_forward)
    fc_in, _, fc_out = ffn[0], ffn[1], ffn[2]
    hidden = _run_plan(fc_in, fp8_plan_of(fc_in, x), x, stock_forward_of(fc_in))
    plan_out = fp8_plan_of(fc_out, hidden)
    if (plan_out.decline_reason is not None
            or (plan_out.shape_mechanism is not None and shape_decline(plan_out.shape_mechanism, hidden))):
        return _run_plan(fc_out, plan_out, F.gelu(hidden, approximate="tanh"), stock_forward_of(fc_out))
    return op.gelu_linear_fp8_triton(hidden, plan_out.weight, plan_out.bias)


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


# ---------------------------------------------------------------------------------------------------------------
# torch.compile: one custom op per module forward
# ---------------------------------------------------------------------------------------------------------------

SLOT_ATTR = "_fused_dit_slot"


def slot_of(module: torch.nn.Module) -> torch.Tensor:
    """The module's number for the custom ops, as a 0-dim int64 CPU tensor (assigned at install, kept for the
    module's life). Traced code passes it as a graph input, not a constant, so the blocks of a model share one
    compiled graph (an int would be specialised: one graph per block, past Dynamo's recompile limit); the op's
    implementation finds the module by it."""
    slot = module.__dict__.get(SLOT_ATTR)
    # a deep copy of a module brings its original's slot along: it gets its own
    if slot is None or STATE.fp8_modules_by_slot.get(int(slot)) is not module:
        number = STATE.next_fp8_slot
        STATE.next_fp8_slot += 1
        slot = module.__dict__[SLOT_ATTR] = torch.tensor(number, dtype=torch.int64)
        STATE.fp8_modules_by_slot[number] = module
    return slot


def _module_at(slot: torch.Tensor) -> torch.nn.Module:
    module = STATE.fp8_modules_by_slot.get(int(slot))
    if module is None:
        raise RuntimeError(f"fused_dit: no live module has FP8 slot {slot} (the compiled graph outlived its model)")
    return module


def _any_requires_grad(x: torch.Tensor, linears) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or any(
        p.requires_grad for m in linears for p in (m.weight, getattr(m, "bias", None)) if p is not None))


def _traced_linear_forward(module: torch.nn.Module, x: torch.Tensor, stock_forward) -> torch.Tensor:
    # decided while tracing (Dynamo guards grad mode and requires_grad): the custom op has no backward
    if _any_requires_grad(x, (module,)):
        return stock_forward(x)
    linear = _LINEAR_CLAMPING if _clamps_input(module) else _LINEAR
    return linear(x, module._fused_dit_slot, module.weight.shape[0])


def _clamps_input(module: torch.nn.Module) -> bool:
    """Whether the module's FP8 forward clamps its input in place: ComfyUI's fp8 checkpoints' static semantics."""
    return module.weight.dtype == FP8_DTYPE and not getattr(module, DYNAMIC_INPUT_ATTR, False)


def _traced_ffn_forward(ffn: torch.nn.Sequential, x: torch.Tensor, stock_forward) -> torch.Tensor:
    if _any_requires_grad(x, (ffn[0], ffn[2])):
        return stock_forward(x)
    ffn_op = _FFN_CLAMPING if _clamps_input(ffn[0]) else _FFN
    return ffn_op(x, ffn._fused_dit_slot, ffn[2].weight.shape[0])


def _linear_impl(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    module = _module_at(slot)
    return fp8_linear_forward(module, x, stock_forward_of(module))


def _ffn_impl(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    ffn = _module_at(slot)
    return ffn_forward_fp8(ffn, x, stock_forward_of(ffn))


def _linear_fake(x, slot, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


# ComfyUI's fp8 checkpoints (e4m3 weights without scale_input) clamp the input in place, as ComfyUI's fp8_linear
# does: their ops declare that they mutate x
_LINEAR = library.register("fp8_linear_module", _linear_impl, _linear_fake)
_FFN = library.register("fp8_ffn_module", _ffn_impl, _linear_fake)


def _linear_clamping_impl(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    return _linear_impl(x, slot, out_features)


def _ffn_clamping_impl(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    return _ffn_impl(x, slot, out_features)


_LINEAR_CLAMPING = library.register("fp8_linear_module_clamping", _linear_clamping_impl, _linear_fake,
                                    mutates_args=("x",))
_FFN_CLAMPING = library.register("fp8_ffn_module_clamping", _ffn_clamping_impl, _linear_fake, mutates_args=("x",))
