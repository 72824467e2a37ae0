"""Op seams: ops replaced where ComfyUI calls them, for as long as the overlays are enabled on a model.

Since the comfy-kitchen era ComfyUI sends RoPE through `comfy.quant_ops.ck`: `comfy.ldm.flux.math.apply_rope` /
`apply_rope1` (0.24 and later: functions that call `comfy.quant_ops.ck.apply_rope` / `apply_rope1` at call time,
unless training) are what Flux's `attention` and Wan's self-attention call. The seam swaps the two functions of
that `ck` namespace for the overlay's RoPE kernel (ops/rope.py), which calls the function it replaced wherever the
kernel cannot run. The block forwards stay ComfyUI's own, so every hook inside them (attn1_patch,
attn1_output_patch, NAG-style patches, modulation dims, per-block attention) keeps working.

`ck` is bound by name at call time (the wrapper reads `comfy.quant_ops.ck.apply_rope` each call), so patching the
namespace's attribute reaches every caller; it is process-wide while enabled, so `enable` installs it and
`disable` restores exactly the objects that were there (the node does both around each model call, in a
`finally`, as ComfyUI's own torch.compile helper swaps its compiled module in and out). A seam whose slot holds
something else by then (another node replaced it meanwhile) is left alone. The seam runs only where the functions
around it match a release it was verified on (variants.json `rope_ck_seam`), and only when asked for
(FUSED_DIT_SEAMS=rope_ck_seam): it gives the eager chain's bits but measured slower than comfy-kitchen's CUDA
kernel on the H200, so by default RoPE stays comfy-kitchen's.
"""
from __future__ import annotations

import functools

import torch

from .. import state
from ..library import compiling
from ..ops import rope
from . import compiled, eras

ROPE_VARIANT = "rope_ck_seam"
MATH = "comfy/ldm/flux/math.py"
_INSTALLED_ATTR = "_fused_dit_seams"
# (id(namespace), name, id(original)) -> the replacement, so enable/disable hand out the same function objects
# (torch.compile guards on what it traced)
_REPLACEMENTS: dict[tuple[int, str, int], tuple[object, object]] = {}


def rope_module_globals(model: torch.nn.Module) -> dict | None:
    """The globals of the module whose apply_rope / apply_rope1 the model's blocks call (ComfyUI's
    comfy.ldm.flux.math), found from the first block that names one, or None."""
    for module in model.modules():
        for class_name, name in (("DoubleStreamBlock", "attention"), ("SingleStreamBlock", "attention"),
                                 ("WanAttentionBlock", "apply_rope1")):
            cls = eras.class_named(module, class_name)
            function = None if cls is None else eras.module_namespace(cls).get(name)
            namespace = getattr(function, "__globals__", None)
            if namespace is not None:
                return namespace
    return None


def rope_dependencies(namespace: dict) -> dict[str, object]:
    return {f"{MATH}:{name}": namespace[name] for name in ("apply_rope", "apply_rope1", "_apply_rope1")
            if name in namespace}


def kitchen(namespace: dict):
    """`comfy.quant_ops.ck` as the math module reaches it, or None."""
    ck = namespace.get("comfy")
    for attribute in ("quant_ops", "ck"):
        ck = getattr(ck, attribute, None)
    return ck


def _rope1_seam(original, x, freqs_cis):
    if compiling() and not compiled.fused("norm_rope", ("norm_rope",)):
        return original(x, freqs_cis)
    return rope.apply_rope1(x, freqs_cis, fallback=original)


def _rope_seam(original, xq, xk, freqs_cis):
    if compiling():
        if not compiled.fused("norm_rope", ("norm_rope",)):
            return original(xq, xk, freqs_cis)
        return rope.apply_rope(xq, xk, freqs_cis)
    if rope.kernel_runs(xq, freqs_cis) and rope.kernel_runs(xk, freqs_cis):
        return rope.apply_rope(xq, xk, freqs_cis)
    return original(xq, xk, freqs_cis)


_SEAMS = {"apply_rope": _rope_seam, "apply_rope1": _rope1_seam}


def _replacement(namespace, name: str, original):
    key = (id(namespace), name, id(original))
    cached = _REPLACEMENTS.get(key)
    if cached is None or cached[0] is not original:
        cached = (original, functools.partial(_SEAMS[name], original))
        _REPLACEMENTS[key] = cached
    return cached[1]


def _verdict(namespace: dict | None) -> tuple[str | None, object, str | None]:
    """(why the RoPE seam stays stock or None, the ck namespace, the release it was verified on) for the math module
    a model's blocks call."""
    if namespace is None:
        return "the model's blocks call no apply_rope of a module the seam knows", None, None
    verdict = eras.seam_match(ROPE_VARIANT, rope_dependencies(namespace))
    if not verdict.matched:
        return verdict.reason, None, None
    off = state.all_variants()[ROPE_VARIANT].switched_off()   # present: it matched
    if off:
        eras.say_once(ROPE_VARIANT, off)
        return off, None, None
    ck = kitchen(namespace)
    if ck is None or not all(callable(getattr(ck, name, None)) for name in _SEAMS):
        eras.say_once(ROPE_VARIANT, "comfy.quant_ops.ck has no apply_rope/apply_rope1 (comfy-kitchen missing)")
        return "comfy.quant_ops.ck has no apply_rope/apply_rope1", None, None
    return None, ck, verdict.verified_on


def would_install(namespace: dict | None) -> bool:
    """Whether install would swap the RoPE seam in for a model whose blocks call this math module."""
    return _verdict(namespace)[0] is None


def install(model: torch.nn.Module, ops, namespace: dict | None) -> dict:
    """Swap the seams of the enabled families in for this model; returns {seam: what runs, or why not}.
    `namespace`: rope_module_globals(model), which the caller's install plan holds."""
    if "norm_rope" not in ops or _INSTALLED_ATTR in model.__dict__:
        return {}
    why, ck, verified_on = _verdict(namespace)
    if why is not None:
        return {ROPE_VARIANT: f"stock: {why}"}
    ours = {id(replacement) for _, replacement in _REPLACEMENTS.values()}
    if any(id(getattr(ck, name)) in ours for name in _SEAMS):
        return {ROPE_VARIANT: "runs (installed for another model)"}
    installed = []
    for name in _SEAMS:
        original = getattr(ck, name)
        replacement = _replacement(ck, name, original)
        setattr(ck, name, replacement)
        installed.append((ck, name, original, replacement))
    model.__dict__[_INSTALLED_ATTR] = installed
    return {ROPE_VARIANT: f"runs (verified on ComfyUI {verified_on})"}


def restore(model: torch.nn.Module) -> int:
    """Put back what install replaced (only where the slot still holds the seam); returns how many."""
    restored = 0
    for target, name, original, replacement in model.__dict__.pop(_INSTALLED_ATTR, ()):
        if getattr(target, name, None) is replacement:
            setattr(target, name, original)
            restored += 1
    return restored
