"""ComfyUI custom node "TiledSampling": MODEL -> MODEL that samples the latent tile by tile at every model call.

A thin call: fused_dit.tiling.wrappers puts two wrappers on a clone of the ModelPatcher (see that module); the
inputs are checked here, in ComfyUI's validation, before anything runs. This module imports no torch: the tiling
package is imported when the node first runs, its pure planner (plan.py) for validation.
"""
from __future__ import annotations

from fused_dit.tiling import plan as tiling_plan

TILE_MULTIPLE = tiling_plan.TILE_MULTIPLE
MIN_TILE_PX, MAX_TILE_PX = 256, 16384
# at most half the smallest tile: no overlap within the inputs' ranges can leave a canvas untiled
MAX_OVERLAP_PX = MIN_TILE_PX // 2
MAX_TILE_BATCH = 64


def tile_px_problem(tile_px: int) -> str | None:
    """Why `tile_px` cannot be a tile side (0: planned), or None. ComfyUI checks no min or max of an input that
    VALIDATE_INPUTS names, so the range is checked here; the other inputs' ranges are ComfyUI's own checks."""
    if tile_px == 0:
        return None
    if not MIN_TILE_PX <= tile_px <= MAX_TILE_PX:
        return (f"tile_px {tile_px} is outside {MIN_TILE_PX}..{MAX_TILE_PX} (or 0: the size the model was "
                "trained at)")
    return tiling_plan.pixel_settings_problem(tile_px, 0, TILE_MULTIPLE)


class TiledSampling:
    CATEGORY = "advanced/model"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = ("Samples a large canvas tile by tile: at every model call the latent is cut into overlapping "
                   "tiles of a size the model was trained at, run in batches, and blended back, so VRAM tracks a "
                   "tile, not the canvas. Seamless: a tile's outer quarter of the overlap is never blended in "
                   "where a neighbour covers it. Put it before KSampler (e.g. a refinement at denoise 0.3 after an "
                   "upscale); Fused DiT Ops before or after it keeps its kernels in every tile. Flux.1, Qwen-Image "
                   "and Wan 2.1 / 2.2 14B (every frame with its tile); other models run untiled, said once. 0 / -1 "
                   "mean planned from the model and the free VRAM.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)},
                "optional": {
                    "tile_px": ("INT", {"default": 0, "min": 0, "max": MAX_TILE_PX, "step": TILE_MULTIPLE,
                                        "tooltip": f"Tile side in image pixels, a multiple of {TILE_MULTIPLE} from "
                                                   f"{MIN_TILE_PX}; 0: the size the model was trained at (1024 for "
                                                   "Flux and Qwen-Image, 832 for Wan)."}),
                    "overlap_px": ("INT", {"default": -1, "min": -1, "max": MAX_OVERLAP_PX, "step": 8,
                                           "tooltip": "Overlap of neighbouring tiles in image pixels (whole latent "
                                                      "pixels of 8 are used); -1: planned (128). A quarter of it at "
                                                      "each tile's edge is not blended in: that is what makes the "
                                                      "tiles seamless."}),
                    "tile_batch": ("INT", {"default": 0, "min": 0, "max": MAX_TILE_BATCH,
                                           "tooltip": "Tiles in one forward; 0: as many as the free VRAM holds, up "
                                                      "to where batching stops paying."}),
                    "canvas": (["auto", "gpu", "host"], {"default": "auto",
                                                         "tooltip": "Where the canvas latent lives while sampling: "
                                                                    "auto keeps it on the host when it would take "
                                                                    "more VRAM than a batch of tiles."})}}

    @classmethod
    def VALIDATE_INPUTS(cls, tile_px=0):
        return tile_px_problem(tile_px) or True

    def patch(self, model, tile_px=0, overlap_px=-1, tile_batch=0, canvas="auto"):
        from fused_dit.tiling import wrappers
        return (wrappers.apply(model, wrappers.Request(tile_px, overlap_px // 8 * 8 if overlap_px > 0 else overlap_px,
                                                       tile_batch, canvas)),)
