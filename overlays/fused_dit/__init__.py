"""fused_dit: Triton operator overlays for DiT blocks (Flux, Wan) with eager references and a ComfyUI node.

    import fused_dit
    report = fused_dit.enable(diffusion_model, ops=("norm_rope", "adaln", "gate", "fp8_linear"))
    ...
    fused_dit.disable(diffusion_model)

Op functions are importable from here (loaded on first use, so importing the package never imports Triton):
flux_rms_rope, wan_rms_rope, adaln, gate_add, quantize_fp8_dynamic, quantize_fp8_comfy,
linear_fp8, gelu_quantize_fp8_dynamic, gelu_quantize_fp8_comfy. Each picks Triton or its eager reference through
`fused_dit.dispatch` and logs the reason once (logger "fused_dit").
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
    "enable": ("integration", "enable"),
    "disable": ("integration", "disable"),
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
