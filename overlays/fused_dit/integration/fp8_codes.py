"""FP8 codes in place of the bf16 weights in ComfyUI: half the weight memory on the GPU (issue 13.2).

With the weights alongside their codes (`fp8_modules`), FP8 linears cost one more byte per parameter on the GPU:
Flux-dev +8 GiB, Wan 14B +13 GiB over stock. Here each FP8 linear of a block becomes an `Fp8CodesLinear`: e4m3
codes and a per-tensor fp32 scale, ComfyUI's own scaled-fp8 layout (`weight`, `scale_weight`, `scale_input` None),
so the GPU holds 1 byte per parameter instead of 2.

The swap goes through ComfyUI's own machinery, so that ModelPatcher's loading, offload and LoRA keep working:
- `add_object_patches(patcher)` registers one object patch per Linear on the node's clone of the ModelPatcher.
  ComfyUI applies object patches when it loads that clone and restores the original modules when it unloads it,
  so the MODEL the node was given, other branches of the workflow and the saved weights never change, and
  `disable` has nothing to restore. The bf16 originals stay where ComfyUI keeps an offloaded model (host memory).
- The clone gets a fresh `patches_uuid`, as ComfyUI's `add_patches` does when weights change. When a workflow
  switches between the stock MODEL and this one, ComfyUI then unpatches the weights of the one loaded before and
  moves the model to its offload device; with the same uuid it would keep the model "loaded" and restore the
  object patches' originals without moving them (bf16 weights left in host memory under a model that counts as
  on the GPU). The clone's `size` is lowered by the bytes saved, so ComfyUI's memory planning sees the real size.
- LoRA: `convert_weight` / `set_weight` are the hooks ComfyUI's weight patching calls for scaled-fp8 modules (the
  codes times the scale in, new codes at the same scale out, stochastic rounding as ComfyUI's own), so LoRA baked
  at load and ComfyUI's low-VRAM LoRA functions work as on its own fp8 checkpoints.
- Low VRAM: with `comfy_cast_weights` set or the codes on another device than the input, the forward casts the
  codes to the input's device and dtype per call, applies `weight_function` / `bias_function`, and multiplies by
  the scale, as ComfyUI's scaled-fp8 Linear does.

Under ComfyUI's DynamicVRAM (`ModelPatcherDynamic`, is_dynamic() true) nothing is swapped: comfy-aimdo owns the
weights (resident in its own VRAM allocation or streamed per call, at its choice) and ComfyUI's cast hands each
Linear its bf16 weight per call; its LoRA path (weight_lowvram_function, applied to that weight's plain values)
would miss the codes' scale. The FP8 forward then runs through ComfyUI's cast (`fp8_weights`), quantising each
weight for its call (the registry's PER_CALL_CODES; it says once where the measurements of that are).

The overlay's FP8 forward (`fp8_modules`) reads the codes as they are, with dynamic per-tensor activation scales
(`fused_dit_dynamic_input`): the same codes, scales and GEMM as with the weights alongside, so the output is the
same bits. Any call that FP8 forward declines runs this module's own forward: the dequantised weight, no longer
the exact bf16 one (the price of not keeping it on the GPU).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops import fp8_linear as op
from ..ops.quantize_fp8 import FP8_DTYPE

FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
DIFFUSION_MODEL = "diffusion_model"   # the ModelPatcher's BaseModel attribute holding the diffusion model


class Fp8CodesLinear(torch.nn.Linear):
    """A Linear whose weight is float8_e4m3fn codes with a per-tensor fp32 `scale_weight` (ComfyUI's scaled-fp8
    Linear layout). Built by `from_linear`; never initialised from random numbers."""

    fused_dit_dynamic_input = True   # fp8_modules: activations get dynamic scales, not ComfyUI's unit input scale
    comfy_cast_weights = False       # ComfyUI's low-VRAM loader sets it per instance when it leaves us offloaded

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        torch.nn.Module.__init__(self)
        self.out_features, self.in_features = codes.shape
        self.weight = torch.nn.Parameter(codes, requires_grad=False)
        self.scale_weight = torch.nn.Parameter(scale.to(torch.float32), requires_grad=False)
        self.scale_input = None
        self.bias = bias
        self.weight_function: list = []
        self.bias_function: list = []

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, source: torch.Tensor, compute_device: torch.device,
                    store_device: torch.device) -> "Fp8CodesLinear":
        """Codes of `source` (the Linear's weight as ComfyUI would patch it: its un-LoRA'd original) quantised on
        `compute_device` (op 5's per-tensor absmax scale, the same codes the alongside path computes there), kept
        on `store_device`. The bias Parameter is shared with `linear`, not copied."""
        codes, scale = op.quantize_weight_fp8(source.detach().to(compute_device))
        return cls(codes.to(store_device), scale.to(store_device), linear.bias)

    def dequantized_weight(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        weight = self.weight.to(device=device, dtype=dtype, non_blocking=True)
        for function in self.weight_function or ():
            weight = function(weight)
        return weight * self.scale_weight.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        if bias is not None:
            bias = bias.to(device=x.device, dtype=x.dtype, non_blocking=True)
            for function in self.bias_function or ():
                bias = function(bias)
        return F.linear(x, self.dequantized_weight(x.dtype, x.device), bias)

    # ComfyUI's weight patching (model_patcher.get_key_weight): the codes' values in, codes at this scale out
    def convert_weight(self, weight: torch.Tensor, inplace: bool = False, **kwargs) -> torch.Tensor:
        scale = self.scale_weight.to(device=weight.device, dtype=weight.dtype)
        return weight.mul_(scale) if inplace else weight * scale

    def set_weight(self, weight: torch.Tensor, inplace_update: bool = False, seed=None, return_weight: bool = False,
                   **kwargs):
        scaled = (weight / self.scale_weight.to(device=weight.device, dtype=weight.dtype)).clamp(-FP8_MAX, FP8_MAX)
        codes = _round_to_fp8(scaled, seed)
        if return_weight:
            return codes
        if inplace_update:
            self.weight.data.copy_(codes)
        else:
            self.weight = torch.nn.Parameter(codes, requires_grad=False)
        return None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp8 codes"


def _round_to_fp8(values: torch.Tensor, seed) -> torch.Tensor:
    """ComfyUI's stochastic rounding where ComfyUI is importable (it is whenever ComfyUI patches weights), else
    round to nearest."""
    try:
        import comfy.float
    except ImportError:
        return values.to(FP8_DTYPE)
    return comfy.float.stochastic_rounding(values, FP8_DTYPE, seed=0 if seed is None else seed)


@dataclass(frozen=True)
class Replacement:
    """What `add_object_patches` did: object patches added, bytes of weight the GPU no longer holds."""
    linears: int
    bytes_saved: int


def _original_weight(patcher, key: str, module: torch.nn.Linear) -> torch.Tensor:
    """The weight before ComfyUI's weight patches (LoRA): its backup while the model is loaded patched."""
    backup = getattr(patcher, "backup", {}).get(key)
    return module.weight if backup is None else backup.weight


def holds_codes(patcher) -> bool:
    """Whether `patcher` has object patches of FP8 codes already (its own, or those of the clone it came from)."""
    return any(isinstance(obj, Fp8CodesLinear) for obj in getattr(patcher, "object_patches", {}).values())


def add_object_patches(patcher, modules: list[tuple[str, torch.nn.Module]]) -> Replacement:
    """Register an Fp8CodesLinear object patch on `patcher` (a ModelPatcher clone) for each (name, Linear) of its
    diffusion model that the FP8 forward would run; names are relative to the diffusion model.

    The registry chooses this (CODES_IN_PLACE) only where the FP8 forward can run on the patcher's load device
    and ComfyUI's legacy ModelPatcher loads the weights. Quantises on the load device, one Linear at a time, and
    keeps the codes on the patcher's offload device until ComfyUI loads the clone.
    """
    load_device = getattr(patcher, "load_device", None)
    store = torch.device(getattr(patcher, "offload_device", None) or "cpu")
    saved = 0
    replacements: dict[str, Fp8CodesLinear] = {}
    with torch.inference_mode():   # as ComfyUI loads weights: no autograd bookkeeping for the codes
        for name, module in modules:
            key = f"{DIFFUSION_MODEL}.{name}"
            if isinstance(module, Fp8CodesLinear):
                # loaded with an earlier clone's object patches in place: the original is in ComfyUI's backup,
                # and weight patches (LoRA) went to the codes, never to it
                module = getattr(patcher, "object_patches_backup", {}).get(key)
                source = getattr(module, "weight", None)
            elif isinstance(module, torch.nn.Linear):
                source = _original_weight(patcher, f"{key}.weight", module)
            if not isinstance(module, torch.nn.Linear) or isinstance(module, Fp8CodesLinear):
                continue
            weight = module.weight
            if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                continue   # ComfyUI's fp8 checkpoints hold 1 byte per parameter already
            replacements[key] = Fp8CodesLinear.from_linear(module, source, torch.device(load_device), store)
            saved += weight.numel() * weight.element_size() - replacements[key].weight.numel() - 4
    for key, replacement in replacements.items():     # all or none: a failure above registers nothing
        patcher.add_object_patch(key, replacement)
    if replacements:
        # the weights differ from the MODEL this clone came from: ComfyUI unpatches and moves the model when it
        # switches between the two (see the module docstring), as after add_patches
        patcher.patches_uuid = uuid.uuid4()
        if getattr(patcher, "size", 0) > saved:
            patcher.size -= saved
    return Replacement(len(replacements), saved)
