"""fused_dit: Triton operator overlays for DiT blocks (Flux, Wan) with eager references and a ComfyUI node.

    import fused_dit
    report = fused_dit.enable(diffusion_model, ops=("norm_rope", "adaln", "gate", "fp8_linear"))
    ...
    fused_dit.disable(diffusion_model)

The public names below are loaded on first use, so that importing the package imports neither torch nor Triton
(applier's node-pack tools import it in a bare interpreter): the op functions flux_rms_rope, wan_rms_rope, adaln,
gate_add, quantize_fp8_dynamic, quantize_fp8_comfy, linear_fp8, gelu_quantize_fp8_dynamic,
gelu_quantize_fp8_comfy, each picking Triton or its eager reference through `fused_dit.dispatch` (said once,
logger "fused_dit"), and enable / disable from the registry (`fused_dit.registry`), which picks what each op
family runs on a loaded model. The ComfyUI node imports the registry itself, not through these names.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> (module under fused_dit, attribute)
_LAZY_EXPORTS = {
    "flux_rms_rope": ("ops.rms_rope", "flux_rms_rope"),
    "wan_rms_rope": ("ops.rms_rope", "wan_rms_rope"),
    "adaln": ("ops.adaln", "adaln"),
    "gate_add": ("ops.gate_add", "gate_add"),
    "quantize_fp8_dynamic": ("ops.quantize_fp8", "quantize_fp8_dynamic"),
    "quantize_fp8_comfy": ("ops.quantize_fp8", "quantize_fp8_comfy"),
    "linear_fp8": ("ops.fp8_linear", "linear_fp8"),
    "quantize_weight_fp8": ("ops.fp8_linear", "quantize_weight_fp8"),
    "gelu_quantize_fp8_dynamic": ("ops.gelu_quantize_fp8", "gelu_quantize_fp8_dynamic"),
    "gelu_quantize_fp8_comfy": ("ops.gelu_quantize_fp8", "gelu_quantize_fp8_comfy"),
    "enable": ("registry", "enable"),
    "disable": ("registry", "disable"),
    "OP_FAMILIES": ("integration", "OP_FAMILIES"),
    "UnsupportedModelError": ("integration", "UnsupportedModelError"),
}

__all__ = ["__version__", *_LAZY_EXPORTS]


def __getattr__(name: str):
    try:
        module_name, attribute = _LAZY_EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'fused_dit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), attribute)
    globals()[name] = value
    return value
