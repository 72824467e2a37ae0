"""ComfyUI-shaped weight ops of the 2026 releases, written for these tests (not ComfyUI's code).

What fused_dit's FP8 seam relies on in comfy/ops.py and comfy/model_patcher.py of 0.24-0.33, reduced to behaviour:
- `cast_bias_weight(s, input, dtype, device, bias_dtype, offloadable, compute_dtype, want_requant)` gives the weight
  and bias on the input's device: it applies a module's `weight_lowvram_function` (LoRA under DynamicVRAM) to the
  weight it streams in, requantising a quantized weight when asked (want_requant), then its `weight_function` /
  `bias_function` lists; with offloadable it also returns an offload token that `uncast_bias_weight` takes back.
  Every call is recorded in `CASTS` (module, whether the weight came from another device).
- `Linear`: an nn.Linear op whose forward casts when `comfy_cast_weights` is set or a function list is non-empty;
  `MixedLinear`: mixed-precision ops' Linear, a plain nn.Module holding a `QuantizedTensor`.
- `QuantizedTensor`: the parts of comfy-kitchen's tensor the seam reads: `_qdata` (e4m3 codes), `_params.scale`,
  `_layout_cls` (the layout's name), `dequantize()`; its `dtype` is the original dtype, as comfy-kitchen reports.
- `DynamicPatcher`: what ModelPatcherDynamic's load leaves on a model: every cast op gets `comfy_cast_weights`, a vbar
  slot `_v`, empty function lists and, for weights with patches, a `weight_lowvram_function`; weights stay where
  they were (host memory) and are streamed in by the cast. `is_dynamic()` is true. With `resident` set, a weight
  streamed in stays: the cast hands back that same tensor (`_v_weight`, with a fresh `_v_signature` when it faults
  in), as ComfyUI 0.33.0's cast does for a resident vbar weight.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from test_fp8_codes import LifecyclePatcher

FP8 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(FP8).max)
CASTS: list[tuple[str, bool]] = []
UNCASTS: list[str] = []


class QuantizedTensor:
    """A per-tensor e4m3 quantized weight: codes [N, K] and a 0-dim fp32 scale."""

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor, orig_dtype: torch.dtype,
                 layout: str = "TensorCoreFP8E4M3Layout"):
        self._qdata, self._layout_cls = qdata, layout
        self._params = SimpleNamespace(scale=scale.float().reshape(()), orig_dtype=orig_dtype,
                                       orig_shape=tuple(qdata.shape))
        self.requires_grad = False

    @classmethod
    def quantize(cls, weight: torch.Tensor, layout: str = "TensorCoreFP8E4M3Layout") -> "QuantizedTensor":
        scale = weight.detach().abs().amax().float().clamp_min(1e-12) / E4M3_MAX
        codes = (weight.detach().float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
        return cls(codes, scale, weight.dtype, layout)

    dtype = property(lambda self: self._params.orig_dtype)
    device = property(lambda self: self._qdata.device)
    shape = property(lambda self: self._qdata.shape)

    def numel(self) -> int:
        return self._qdata.numel()

    def element_size(self) -> int:
        return self._qdata.element_size()

    def dequantize(self) -> torch.Tensor:
        return (self._qdata.float() * self._params.scale).to(self._params.orig_dtype)

    def to_device(self, device) -> "QuantizedTensor":
        return QuantizedTensor(self._qdata.to(device), self._params.scale.to(device), self._params.orig_dtype,
                               self._layout_cls)


def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None, offloadable=False,
                     compute_dtype=None, want_requant=False):
    dtype = input.dtype if dtype is None else dtype
    bias_dtype = dtype if bias_dtype is None else bias_dtype
    device = input.device if device is None else device
    weight = s._parameters["weight"]
    streamed = getattr(s, "_streamed_from_host", False)
    CASTS.append((getattr(s, "seed_key", type(s).__name__), streamed))
    lowvram = getattr(s, "weight_lowvram_function", None)
    if isinstance(weight, QuantizedTensor):
        weight = weight.to_device(device)
        if lowvram is not None or s.weight_function:
            value = lowvram(weight.dequantize().to(compute_dtype or dtype)) if lowvram is not None else \
                weight.dequantize()
            weight = QuantizedTensor.quantize(value) if want_requant and not s.weight_function else value
    elif getattr(s, "_resident", False) and "_v_weight" in s.__dict__ and s._v_weight.dtype == dtype:
        weight = s._v_weight      # aimdo's resident copy, handed back itself (a LoRA went in when it faulted in)
    else:
        weight = weight.to(device=device, dtype=dtype, copy=True)
        if lowvram is not None:
            weight = lowvram(weight)
        if getattr(s, "_resident", False):
            s._v_weight, s._v_signature = weight, object()
    for function in s.weight_function:
        weight = function(weight if not isinstance(weight, QuantizedTensor) else weight.dequantize())
    bias = s._parameters.get("bias")
    if bias is not None:
        bias = bias.to(device=device, dtype=bias_dtype)
        for function in s.bias_function:
            bias = function(bias)
    return (weight, bias, ("offload", s)) if offloadable else (weight, bias)


def uncast_bias_weight(s, weight, bias, offload_stream):
    if offload_stream is not None:
        UNCASTS.append(getattr(s, "seed_key", type(s).__name__))


class CastWeightBiasOp:
    comfy_cast_weights = False
    weight_function: list = []
    bias_function: list = []


class Linear(torch.nn.Linear, CastWeightBiasOp):
    def forward_comfy_cast_weights(self, input):
        weight, bias, offload = cast_bias_weight(self, input, offloadable=True)
        try:
            return F.linear(input, weight, bias)
        finally:
            uncast_bias_weight(self, weight, bias, offload)

    def forward(self, input):
        if self.comfy_cast_weights or self.weight_function or self.bias_function:
            return self.forward_comfy_cast_weights(input)
        return super().forward(input)


class MixedLinear(torch.nn.Module, CastWeightBiasOp):
    """mixed-precision ops' Linear shape: in/out features, a QuantizedTensor weight, a bf16 bias."""

    def __init__(self, linear: torch.nn.Linear, layout: str = "TensorCoreFP8E4M3Layout"):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._parameters["weight"] = QuantizedTensor.quantize(linear.weight, layout)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().clone(),
                                                                        requires_grad=False)
        self.layout_type, self.quant_format = layout, "float8_e4m3fn"

    def forward_comfy_cast_weights(self, input):
        weight, bias, offload = cast_bias_weight(self, input, offloadable=True, compute_dtype=input.dtype)
        try:
            if isinstance(weight, QuantizedTensor):
                weight = weight.dequantize()
            return F.linear(input, weight.to(input.dtype), bias)
        finally:
            uncast_bias_weight(self, weight, bias, offload)

    def forward(self, input):
        return self.forward_comfy_cast_weights(input)


def to_comfy_ops(model: torch.nn.Module, mixed: set[str] = frozenset()) -> torch.nn.Module:
    """Every nn.Linear of `model` as this file's Linear op (same tensors), those named in `mixed` as MixedLinear."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is torch.nn.Linear:
                replacement = MixedLinear(child) if full in mixed else _as_op(child)
                setattr(module, child_name, replacement)
    return model


def _as_op(linear: torch.nn.Linear) -> Linear:
    op = Linear.__new__(Linear)
    op.__dict__.update(linear.__dict__)
    op._parameters = dict(linear._parameters)
    return op


class DynamicPatcher(LifecyclePatcher):
    """The load ModelPatcherDynamic does, as far as the ops see it (clone, patches and sample as the lifecycle
    fake of test_fp8_codes.py has them)."""

    resident = False     # True: weights stay in VRAM once streamed in (comfy-aimdo's vbar with room to spare)

    def is_dynamic(self) -> bool:
        return True

    def load(self):
        for name, module in self.model.diffusion_model.named_modules():
            if not isinstance(module, CastWeightBiasOp):
                continue
            module.comfy_cast_weights, module.seed_key = True, name
            module._v, module._streamed_from_host = ("vbar slot", name), True
            module._resident = self.resident
            if "_v_weight" in module.__dict__ and not self.resident:
                del module._v_weight
            module.weight_function, module.bias_function = [], []
            patches = self.patches.get(f"diffusion_model.{name}.weight")
            module.weight_lowvram_function = None if not patches else _AddDelta(patches)


class _AddDelta:
    """A LoRA as ComfyUI's LowVramPatch applies it: the patched weight from the streamed one."""

    def __init__(self, patches: list[tuple[float, torch.Tensor]]):
        self.patches = patches

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        value = weight.float()
        for strength, delta in self.patches:
            value = value + strength * delta.to(device=weight.device)
        return value.to(weight.dtype)
