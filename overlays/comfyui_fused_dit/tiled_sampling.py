"""ComfyUI custom node "TiledSampling": MODEL -> MODEL that samples the latent tile by tile at every model call.

A thin call: fused_dit.tiling.wrappers puts two wrappers on a clone of the ModelPatcher (see that module); the
inputs are checked here, in ComfyUI's validation, before anything runs. This module imports no torch: the tiling
package is imported when the node first runs, its pure planner (plan.py) for validation.
"""
from __future__ import annotations

from fused_dit.tiling import plan as tiling_plan

# a tile side is whole tokens: the VAE's 8 pixels x the 2x2 patch of every model the node tiles
TILE_MULTIPLE = 16


class TiledSampling:
    CATEGORY = "advanced/model"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = ("Samples a large canvas tile by tile: at every model call the latent is cut into overlapping "
                   "tiles of a size the model was trained at, run in batches, and blended back, so VRAM tracks a "
                   "tile, not the canvas. Put it before KSampler (e.g. a refinement at denoise 0.3 after an "
                   "upscale); Fused DiT Ops before or after it keeps its kernels in every tile. Flux, Qwen-Image and "
                   "Wan 2.1 (every frame with its tile); other models run untiled. 0 / -1 mean planned from the "
                   "model and the free VRAM.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)},
                "optional": {
                    "tile_px": ("INT", {"default": 0, "min": 0, "max": 16384, "step": TILE_MULTIPLE,
                                        "tooltip": "Tile side in image pixels, a multiple of 16; 0: the size the "
                                                   "model was trained at (1024 for Flux and Qwen-Image)."}),
                    "overlap_px": ("INT", {"default": -1, "min": -1, "max": 8192, "step": 8,
                                           "tooltip": "Overlap of neighbouring tiles in image pixels, a multiple of "
                                                      "8; -1: planned (128)."}),
                    "tile_batch": ("INT", {"default": 0, "min": 0, "max": 64,
                                           "tooltip": "Tiles in one forward; 0: as many as the free VRAM holds, up "
                                                      "to where batching stops paying."}),
                    "canvas": (["auto", "gpu", "host"], {"default": "auto",
                                                         "tooltip": "Where the canvas latent lives while sampling: "
                                                                    "auto keeps it on the host when it would take "
                                                                    "more VRAM than a batch of tiles."})}}

    @classmethod
    def VALIDATE_INPUTS(cls, tile_px=0, overlap_px=-1, tile_batch=0):
        problem = tiling_plan.pixel_settings_problem(tile_px, overlap_px, TILE_MULTIPLE)
        if problem is None and overlap_px < -1:
            problem = f"overlap_px {overlap_px}: give -1 (planned) or an overlap of 0 or more"
        if problem is None and tile_batch < 0:
            problem = f"tile_batch {tile_batch}: give 0 (planned) or a batch of 1 or more"
        return problem or True

    def patch(self, model, tile_px=0, overlap_px=-1, tile_batch=0, canvas="auto"):
        from fused_dit.tiling import wrappers
        return (wrappers.apply(model, wrappers.Request(tile_px, overlap_px, tile_batch, canvas)),)


