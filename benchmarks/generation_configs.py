"""The configs of benchmarks/generation.py: the MODEL each hands to KSampler, built with ComfyUI's and the pack's
own calls, and undoing what a config left behind.

An overlay config asks the Fused DiT Ops node for a set of families; the node's INPUT_TYPES says which it offers
(the pack changes while ComfyUI does), so each run gets the families that exist, and names the ones it asked for
and did not find. A config that finds none of its families, or ComfyUI's sage attention without sageattention
installed, raises ConfigSkipped: recorded as skipped, never run as something else.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import time

CONFIGS = ("stock", "overlay", "overlay_fp8", "comfy_fp8", "comfy_fp8_fast", "compile", "overlay_compile",
           "overlay_fp8_alongside", "overlay_compile_allops", "overlay_attention", "overlay_all", "overlay_all_fp8",
           "overlay_all_fp8_alongside", "comfy_sage", "overlay_all_compile", "node_defaults", "overlay_attention_fp8",
           "overlay_all_fp8_attn", "overlay_all_fp8_attn_compile")
# the node as a user drops it in: every input at the default its INPUT_TYPES declares (what ComfyUI then sends)
NODE_DEFAULTS = "node_defaults"
COMPILE_CONFIGS = ("compile", "overlay_compile", "overlay_compile_allops", "overlay_all_compile",
                   "overlay_all_fp8_attn_compile")
# configs that only exist on ComfyUI's fp8 weights
FP8_WEIGHT_CONFIGS = ("comfy_fp8", "comfy_fp8_fast")
# the node's exact families (output at bf16 rounding of stock or bit-identical), in the order overlay_all asks
EXACT_FAMILIES = ("norm_rope", "adaln", "gate", "attention")
_ELEMENTWISE = ("norm_rope", "adaln", "gate")
OVERLAY_FAMILIES = {
    "overlay": _ELEMENTWISE,
    "overlay_fp8": _ELEMENTWISE + ("fp8_linear",),
    "overlay_fp8_alongside": _ELEMENTWISE + ("fp8_linear",),
    "overlay_compile": _ELEMENTWISE,
    "overlay_compile_allops": _ELEMENTWISE,
    "overlay_attention": ("attention",),
    "overlay_all": EXACT_FAMILIES,
    "overlay_all_fp8": EXACT_FAMILIES + ("fp8_linear",),
    "overlay_all_fp8_alongside": EXACT_FAMILIES + ("fp8_linear",),
    "overlay_all_compile": EXACT_FAMILIES,
    "overlay_attention_fp8": ("attention",),
    "overlay_all_fp8_attn": EXACT_FAMILIES + ("fp8_linear",),
    "overlay_all_fp8_attn_compile": EXACT_FAMILIES + ("fp8_linear",),
}
# configs that ask the attention family for its fp8 mode (the node's attention_mode input)
FP8_ATTENTION_CONFIGS = ("overlay_attention_fp8", "overlay_all_fp8_attn", "overlay_all_fp8_attn_compile")
# what comfy_sage rebinds, and how to put it back (module, attribute, previous value)
_UNDO: list = []
# issue 50's tiled refinement: "tiled" is the pack's TiledSampling node on UNETLoader's model, "tiled_CONFIG" the
# node on the MODEL that CONFIG builds (e.g. tiled_overlay_all_fp8: Fused DiT Ops, then TiledSampling), never a
# compile config
TILED = "tiled"
# a --tiny run's tile: the node's smallest (comfyui_fused_dit.tiled_sampling.MIN_TILE_PX)
TINY_TILE_PX = 256
# the pack's table entries a --tiny run widened, and what they were (table, key, entry)
_TABLE_UNDO: list = []


def is_tiled(config: str) -> bool:
    return config == TILED or (config.startswith(TILED + "_") and untiled(config) in CONFIGS
                               and untiled(config) not in COMPILE_CONFIGS)


def untiled(config: str) -> str:
    """The config a tiled config puts TiledSampling on (tiled: stock); any other config itself."""
    if config == TILED:
        return "stock"
    return config[len(TILED) + 1:] if config.startswith(TILED + "_") else config


def known_config(config: str) -> bool:
    return config in CONFIGS or is_tiled(config)


class ConfigSkipped(Exception):
    """This config cannot run here; the message says why (recorded, not run)."""


def node_families(input_types: dict) -> tuple:
    """The node's BOOLEAN inputs (its op families), required then optional, in declaration order."""
    names = []
    for section in ("required", "optional"):
        for name, spec in (input_types.get(section) or {}).items():
            if name != "model" and isinstance(spec, tuple) and spec and spec[0] == "BOOLEAN":
                names.append(name)
    return tuple(names)


def node_inputs(config: str, offered: tuple, input_types: dict | None = None) -> tuple[dict, list]:
    """(the node's inputs for this config, the families it wanted that the node does not offer). Every offered
    family is set explicitly (on where wanted, off otherwise), so a family the node adds later with default on
    does not slip into an older config. ConfigSkipped when none of the wanted families is offered."""
    if config == NODE_DEFAULTS:
        return default_inputs(input_types or {}), []
    wanted = OVERLAY_FAMILIES[config]
    inputs = {name: name in wanted for name in offered}
    absent = [name for name in wanted if name not in offered]
    if not any(inputs.values()):
        raise ConfigSkipped(f"the node offers none of {', '.join(wanted)} (it offers: {', '.join(offered)})")
    optional = (input_types or {}).get("optional") or {}
    if inputs.get("fp8_linear") and "fp8_weights" in optional:
        inputs["fp8_weights"] = "alongside" if config.endswith("_alongside") else "replace"
    if config in FP8_ATTENTION_CONFIGS:
        if "attention_mode" not in optional:
            raise ConfigSkipped("the node offers no attention_mode input (no fp8 attention)")
        inputs["attention_mode"] = "fp8"
    return inputs, absent


def default_inputs(input_types: dict) -> dict:
    """The node's inputs at their declared defaults (a widget without one left out, as ComfyUI would use the
    function's own default), the MODEL aside."""
    inputs = {}
    for section in ("required", "optional"):
        for name, spec in (input_types.get(section) or {}).items():
            if name != "model" and isinstance(spec, tuple) and len(spec) > 1 and "default" in spec[1]:
                inputs[name] = spec[1]["default"]
    return inputs


def build_config(config: str, base, tiling: dict | None = None):
    """The MODEL this config hands to KSampler, built with the nodes' own calls; and what was set. A tiled config
    needs `tiling` (tiled_sampling's arguments)."""
    if is_tiled(config):
        patched, details = build_config(untiled(config), base)
        return tiled_sampling(patched, details, **tiling)
    if config in ("stock", "comfy_fp8", "comfy_fp8_fast"):
        return base, {}
    if config == "comfy_sage":
        return base, bind_sage_attention()
    details = {}
    patched = base
    if config.startswith("overlay") or config == NODE_DEFAULTS:
        from comfyui_fused_dit import FusedDiTOps
        node = FusedDiTOps()
        input_types = FusedDiTOps.INPUT_TYPES()
        inputs, absent = node_inputs(config, node_families(input_types), input_types)
        details["node_inputs"] = inputs
        details["families_absent"] = absent
        started = time.perf_counter()
        (patched,) = node.patch(patched, **inputs)
        details["node_s"] = round(time.perf_counter() - started, 2)
        details["object_patches"] = len(getattr(patched, "object_patches", {}))
    if config == "overlay_compile_allops":
        details["ops_under_compile"] = set_ops_under_compile(("norm_rope", "adaln", "gate"))
    elif config == "overlay_compile":
        details["ops_under_compile"] = set_ops_under_compile(None)
    if config in COMPILE_CONFIGS:
        from comfy_api.torch_helpers import set_torch_compile_wrapper
        patched = patched.clone()   # TorchCompileModel.execute: m = model.clone(); set_torch_compile_wrapper(m, ...)
        set_torch_compile_wrapper(model=patched, backend="inductor")
        details["compile"] = {"backend": "inductor", "keys": ["diffusion_model"]}
    return patched, details


def tiled_sampling(patched, details: dict, table_key: str, tile_px: int, tiny: bool):
    """The pack's TiledSampling node on `patched` at `tile_px` (the table's tile; overlap, batch and canvas as the
    node plans them). A --tiny model is narrower than the table's entry, which the node would refuse: for the run,
    the entry's width keys take the tiny model's values (said in the record; restored by release_config)."""
    from comfyui_fused_dit.tiled_sampling import TiledSampling
    from fused_dit.tiling import models as table
    details["tiled_sampling"] = {"table_entry": table_key, "tile_px": tile_px, "overlap_px": "planned",
                                 "tile_batch": "planned", "canvas": "auto"}
    if tiny:
        shape = table.MODELS[table_key]
        config = patched.model.model_config.unet_config
        _TABLE_UNDO.append((table.MODELS, table_key, shape))
        widths = tuple((key, config.get(key)) for key, _ in shape.config_width)
        table.MODELS[table_key] = dataclasses.replace(shape, config_width=widths)
        details["tiled_sampling"]["tiny"] = f"the table's {dict(shape.config_width)} read as {dict(widths)}"
    (tiled,) = TiledSampling().patch(patched, tile_px=tile_px)
    details["tiled_sampling"]["tiled"] = tiled is not patched
    return tiled, details


TILES_LINE = re.compile(r"Tiled Sampling: (\d+) tiles of (\d+) px, overlap (\d+) px .*?\), (\d+) per batch")


def tiles_of(overlay_log: list[str]) -> dict:
    """The node's plan from its one INFO line (wrappers.describe): tiles, tile and overlap px, tiles per batch."""
    for line in overlay_log:
        found = TILES_LINE.search(line)
        if found:
            tiles, tile_px, overlap_px, batch = (int(v) for v in found.groups())
            return {"tiles": tiles, "tile_px": tile_px, "overlap_px": overlap_px, "tile_batch": batch}
    return {}


def bind_sage_attention() -> dict:
    """What `--use-sage-attention` does at import, done for one run: every loaded comfy module that holds
    ComfyUI's current optimized_attention (or optimized_attention_masked) now holds attention_sage."""
    from comfy.ldm.modules import attention

    from . import attention_kernels
    if not getattr(attention, "SAGE_ATTENTION_IS_AVAILABLE", False) or not hasattr(attention, "attention_sage"):
        raise ConfigSkipped("sageattention is not importable here (ComfyUI's SAGE_ATTENTION_IS_AVAILABLE is False)")
    sage = attention.attention_sage
    previous = {"optimized_attention": attention.optimized_attention,
                "optimized_attention_masked": getattr(attention, "optimized_attention_masked", None)}
    rebound = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "comfy" or name.startswith("comfy.")):
            continue
        for attribute, old in previous.items():
            if old is not None and vars(module).get(attribute) is old:
                _UNDO.append((module, attribute, old))
                setattr(module, attribute, sage)
                rebound.append(f"{name}.{attribute}")
    return {"attention": "comfy.ldm.modules.attention.attention_sage",
            "sageattention": attention_kernels.sage_version(), "rebound": sorted(rebound)}


def set_ops_under_compile(families) -> list[str] | None:
    """Set which fused ops stay custom ops while Dynamo traces (None: the package's default); returns the set now
    in force, or None where this fused_dit has no such policy."""
    try:
        from fused_dit.integration import compiled
    except ImportError:
        return None
    compiled.UNDER_COMPILE = compiled.DEFAULT_UNDER_COMPILE if families is None else frozenset(families)
    return sorted(compiled.UNDER_COMPILE)


def release_config(patched, base) -> None:
    """Drop what a config left: the overlay's forwards and FP8 copies (fused_dit.disable), sage's rebinding."""
    while _UNDO:
        module, attribute, old = _UNDO.pop()
        setattr(module, attribute, old)
    while _TABLE_UNDO:
        table, key, entry = _TABLE_UNDO.pop()
        table[key] = entry
    if patched is None or base is None:
        return
    try:
        import fused_dit
        fused_dit.disable(base.model.diffusion_model, drop_fp8_weights=True)
    except Exception as error:   # the record already holds the run; a failed cleanup is logged, not fatal
        import logging
        logging.getLogger(__name__).warning("fused_dit.disable failed: %s", error)
