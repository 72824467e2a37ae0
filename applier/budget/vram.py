"""How the target's ComfyUI holds a model's weights, read from its main.py for `applier budget` (never run).

From 2026-02 (f8acd9c4) main.py initialises comfy-aimdo and loads every model through ComfyUI's DynamicVRAM on an
NVIDIA card (unless started with --disable-dynamic-vram): weights stream to the GPU per call, and the pack's FP8
Linears quantise each weight for its call (overlays/fused_dit/families.py PER_CALL_CODES), so they save no weight
memory there. Earlier releases load the weights whole, and the FP8 Linears' codes take the bf16 weights' place.
"""
from __future__ import annotations

from pathlib import Path

from applier.store.fsutil import read_inside_or_none
from applier.target import Target

MAX_MAIN_PY_BYTES = 1024 * 1024         # ComfyUI's main.py is ~20 kB
AIMDO_MARK = b"comfy_aimdo"


def dynamic_vram_of(target: Target) -> tuple[bool, str]:
    """Whether the target's ComfyUI starts DynamicVRAM by default, and how that was told, in words."""
    root = target.comfyui_root
    if root is None:
        return False, "no ComfyUI folder: weights priced as loaded whole"
    source = read_inside_or_none(Path(root), Path(root) / "main.py", limit=MAX_MAIN_PY_BYTES)
    if source is None:
        return False, "no main.py: weights priced as loaded whole"
    if AIMDO_MARK in source:
        return True, ("main.py starts DynamicVRAM (comfy-aimdo): weights stream per call, the pack's FP8 Linears "
                      "make codes per call and save no weight memory (--disable-dynamic-vram: they do)")
    return False, "main.py loads weights whole (no DynamicVRAM)"
