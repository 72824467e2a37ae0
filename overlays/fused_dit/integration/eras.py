"""Which overlay variant the loaded model's code matches, found through the model's own objects.

The counterpart at run time of `applier overlay check`: for a block the overlays know, `block_match` collects the
functions and classes that block really runs (its class's forward, its QK norm's class, the module globals such as
`attention` that its forward calls), fingerprints their source (fused_dit.fingerprint, the same normaliser the check
uses on the files) and compares them with the releases the block's variant was verified on (fused_dit.variants).
`linear_match` does the same for a Linear op's forward (the FP8 seam).

Fingerprints and verdicts are cached (in state.STATE) by the identity of the objects collected, so the check costs
a few attribute reads per block after the first call (the node enables the overlays around every model call). A
variant that does not match leaves its families stock for that block; the reason is said once (state.say_once)
and returned, so the registry can say it in its line for the family too.
"""
from __future__ import annotations

import logging
import sys

import torch

from .. import fingerprint, state, variants
from ..state import STATE

BLOCKS_PREFIX = "{blocks}:"
LINEAR_VARIANT = "linear_fp8_seam"
LINEAR_FORWARD = "comfy/ops.py:disable_weight_init.Linear.forward"
STAYS_STOCK = "fused_dit: %s stays stock (%s)"


def fingerprint_of(obj) -> tuple[str | None, str]:
    """(sha256 or None, why none) of a live function or class, cached by identity (the object is kept alive)."""
    cached = STATE.fingerprints.get(id(obj))
    if cached is not None and cached[0] is obj:
        return cached[1], cached[2]
    try:
        value, reason = fingerprint.of_object(obj), ""
    except (OSError, TypeError, ValueError, SyntaxError) as exc:
        value, reason = None, f"its source cannot be read ({type(exc).__name__}: {exc})"
    STATE.fingerprints[id(obj)] = (obj, value, reason)
    return value, reason


def class_named(obj, name: str):
    return next((c for c in type(obj).__mro__ if c.__name__ == name), None)


def module_namespace(cls) -> dict:
    """The globals a class's methods see (the module that defines it)."""
    forward = getattr(cls, "forward", None)
    namespace = getattr(forward, "__globals__", None)
    if namespace is None:
        module = sys.modules.get(cls.__module__)
        namespace = vars(module) if module is not None else {}
    return namespace


def _method(obj, class_name: str, method: str = "forward"):
    cls = class_named(obj, class_name) or type(obj)
    return getattr(cls, method, None)


def flux_dependencies(block: torch.nn.Module) -> dict[str, object]:
    """The objects a Flux double or single block runs, keyed as variants.json names them."""
    found: dict[str, object] = {}
    for class_name in ("DoubleStreamBlock", "SingleStreamBlock"):
        cls = class_named(block, class_name)
        if cls is None:
            continue
        found[f"{BLOCKS_PREFIX}{class_name}.forward"] = cls.forward
        namespace = module_namespace(cls)
        for name in ("apply_mod", "attention"):
            if name in namespace:
                found[BLOCKS_PREFIX + name] = namespace[name]
        norm = getattr(getattr(block, "img_attn", None), "norm", None) or getattr(block, "norm", None)
        if norm is not None:
            found[BLOCKS_PREFIX + "QKNorm.forward"] = type(norm).forward
            query_norm = getattr(norm, "query_norm", None)
            if query_norm is not None:
                found[BLOCKS_PREFIX + "RMSNorm.forward"] = type(query_norm).forward
        modulation = getattr(block, "img_mod", None) or getattr(block, "modulation", None)
        if isinstance(modulation, torch.nn.Module):
            found[BLOCKS_PREFIX + "Modulation.forward"] = type(modulation).forward
    return found


def wan_dependencies(block: torch.nn.Module) -> dict[str, object]:
    """The objects a Wan attention block runs, keyed as variants.json names them."""
    cls = class_named(block, "WanAttentionBlock")
    found: dict[str, object] = {BLOCKS_PREFIX + "WanAttentionBlock.forward": cls.forward}
    namespace = module_namespace(cls)
    for name in ("repeat_e", "apply_rope1"):
        if name in namespace:
            found[BLOCKS_PREFIX + name] = namespace[name]
    attn = getattr(block, "self_attn", None)
    if attn is not None:
        found[BLOCKS_PREFIX + "WanSelfAttention.forward"] = type(attn).forward
        norm_q = getattr(attn, "norm_q", None)
        if norm_q is not None and not isinstance(norm_q, torch.nn.Identity):
            found["comfy/ops.py:disable_weight_init.RMSNorm.forward"] = type(norm_q).forward
    return found


def _verdict(variant_name: str, objects: dict[str, object]) -> variants.Match:
    spec = state.all_variants().get(variant_name)
    if spec is None:
        return state.unknown_variant(variant_name)
    key = (variant_name, tuple((k, id(v)) for k, v in sorted(objects.items())),
           tuple(sorted(spec.verified_on)))
    cached = STATE.verdicts.get(key)
    if cached is not None:
        return cached
    found, reasons = {}, {}
    for dep, obj in objects.items():
        found[dep], reasons[dep] = fingerprint_of(obj)
    verdict = variants.match(spec, found, reasons, prefer=running_comfyui_version())
    STATE.verdicts[key] = verdict
    return verdict


def running_comfyui_version() -> str | None:
    """The version of the ComfyUI this process runs (its comfyui_version module, once ComfyUI imported it), so a
    match names that release where the same code shipped in several."""
    return getattr(sys.modules.get("comfyui_version"), "__version__", None)


def block_match(block: torch.nn.Module, variant_name: str, collect) -> variants.Match:
    """Whether this block's code is what `variant_name` was verified on; logs a mismatch once."""
    verdict = _verdict(variant_name, collect(block))
    if not verdict.matched:
        say_once(f"{type(block).__name__}: {verdict.variant}", verdict.reason)
    return verdict


def linear_match(module: torch.nn.Module) -> variants.Match:
    """Whether a Linear op's forward is one the FP8 seam was verified on; logs a mismatch once. The pack's own
    modules (fp8_codes.Fp8CodesLinear, put in a Linear's place by the node) are its own code, always known."""
    cls = type(module)
    verdict = STATE.linear_verdicts.get(cls)       # per class: it runs on every Linear of every model call
    if verdict is None:
        if cls.__module__.split(".")[0] == __name__.split(".")[0]:
            verdict = variants.Match(LINEAR_VARIANT, "fused_dit", "the overlay's own module")
        else:
            verdict = _verdict(LINEAR_VARIANT, {LINEAR_FORWARD: cls.forward})
        STATE.linear_verdicts[cls] = verdict
    if not verdict.matched:
        say_once(f"{cls.__name__}: {LINEAR_VARIANT}", verdict.reason)
    return verdict


def seam_match(variant_name: str, objects: dict[str, object]) -> variants.Match:
    """Whether the functions around an op seam are those `variant_name` was verified on; logs a mismatch once."""
    verdict = _verdict(variant_name, objects)
    if not verdict.matched:
        say_once(variant_name, verdict.reason)
    return verdict


def say_once(subject: str, reason: str) -> None:
    """Say once, at DEBUG, that `subject` stays stock and why: on every release since the one a variant was written
    for that is the normal state, and the registry's one line per model says it briefly at INFO."""
    state.say_once(STAYS_STOCK, subject, reason, level=logging.DEBUG)


def epoch() -> int:
    """Changes whenever a verdict could: caches cleared, verified sets added or removed (install plans key on it)."""
    return STATE.verdict_epoch


def clear_caches() -> None:
    """Forget verdicts and what was said (tests that add or remove verified fingerprint sets)."""
    state.clear_verdicts()
    state.forget_said()
