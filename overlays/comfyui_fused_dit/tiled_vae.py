"""ComfyUI custom nodes "TiledVAEDecode" and "TiledVAEEncode": a tiled VAE that runs once (fused_dit.tiling.vae).

Drop-in for ComfyUI's VAEDecodeTiled / VAEEncodeTiled on 2-D VAEs (Flux's, SD's, Qwen-Image's): one pass of equal
tiles, batched, blended with the Tiled Sampling node's seamless profiles, memory that tracks a batch of tiles. A VAE
the one pass does not fit (a video VAE, one that tiles itself) goes to ComfyUI's own tiled call with the same
numbers, said once. The tile inputs are optional (an API prompt may leave them out: the defaults run); their ranges are ComfyUI's own
checks (no VALIDATE_INPUTS: every value in range runs).
This module imports no torch; the tiling package is imported when a node first runs.
"""
from __future__ import annotations

from fused_dit import state
TILE_INPUTS = {
    "tile_px": ("INT", {"default": 1024, "min": 256, "max": 8192, "step": 64,
                        "tooltip": "Tile side in image pixels. Larger tiles: fewer seams to blend, more VRAM a tile."}),
    "overlap_px": ("INT", {"default": 128, "min": 0, "max": 4096, "step": 8,
                           "tooltip": "Overlap of neighbouring tiles in image pixels (at most half a tile is used); "
                                      "a quarter of it at each tile's edge is not blended in."}),
    "tile_batch": ("INT", {"default": 0, "min": 0, "max": 64,
                           "tooltip": "Tiles in one VAE call; 0: as many as ComfyUI's memory estimate fits, up to 8."}),
}


def _settings(tile_px: int, overlap_px: int, tile_batch: int):
    from fused_dit.tiling import vae as tiled_vae
    return tiled_vae.TileSettings(tile_px, overlap_px, tile_batch)


def _host(vae):
    """ComfyUI's side of the call: its model loading and free memory for this VAE, its progress bar, Cancel."""
    import contextlib

    import comfy.model_management as mm
    import comfy.utils
    from fused_dit.tiling import vae as tiled_vae

    def free_memory() -> int:
        # what ComfyUI reports free, less what it keeps for other programs (--reserve-vram; its model loading keeps
        # the same room): on a 24 GiB card beside a desktop, the batch leaves the desktop its memory
        getter = getattr(vae.patcher, "get_free_memory", None)
        free = int(getter(vae.device) if getter else mm.get_free_memory(vae.device))
        reserved = getattr(mm, "extra_reserved_memory", lambda: 0)()
        return max(0, free - int(reserved))

    def progress(total: int):
        bar = comfy.utils.ProgressBar(total)
        return bar.update_absolute

    context = getattr(mm, "cuda_device_context", None)
    return tiled_vae.Host(
        load=lambda memory: mm.load_models_gpu([vae.patcher], memory_required=memory,
                                               force_full_load=getattr(vae, "disable_offload", False)),
        free_memory=free_memory,
        device_context=(lambda: context(vae.device)) if context else contextlib.nullcontext,
        progress=progress, check_cancel=mm.throw_exception_if_processing_interrupted)


def _stock_reason(vae) -> str | None:
    from fused_dit.tiling import vae as tiled_vae
    reason = tiled_vae.unsupported(vae)
    if reason:
        state.say_once("Tiled VAE: %s: ComfyUI's own tiled VAE runs it", reason)
    return reason


class TiledVAEDecode:
    CATEGORY = "latent"
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    DESCRIPTION = ("Decodes a large latent in one pass of equal tiles, batched, blended seamlessly (ComfyUI's "
                   "VAE Decode (Tiled) runs three passes of different tiles, one tile at a time, and averages them). "
                   "For 2-D VAEs; a video VAE runs ComfyUI's own tiled decode.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "vae": ("VAE",)}, "optional": dict(TILE_INPUTS)}

    def decode(self, samples, vae, tile_px=1024, overlap_px=128, tile_batch=0):
        latent = samples["samples"]
        if getattr(latent, "is_nested", False):
            latent = latent.unbind()[0]
        if _stock_reason(vae):
            factor = vae.spacial_compression_decode()
            images = vae.decode_tiled(latent, tile_x=tile_px // factor, tile_y=tile_px // factor,
                                      overlap=overlap_px // factor)
        else:
            from fused_dit.tiling import vae as tiled_vae
            images = tiled_vae.decode(vae, latent, _settings(tile_px, overlap_px, tile_batch), _host(vae))
        if images.ndim == 5:
            images = images.reshape(-1, *images.shape[-3:])
        return (images,)


class TiledVAEEncode:
    CATEGORY = "latent"
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "encode"
    DESCRIPTION = ("Encodes a large image in one pass of equal tiles, batched, blended seamlessly (ComfyUI's "
                   "VAE Encode (Tiled) runs three passes and averages them). For 2-D VAEs; a video VAE runs "
                   "ComfyUI's own tiled encode.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"pixels": ("IMAGE",), "vae": ("VAE",)}, "optional": dict(TILE_INPUTS)}

    def encode(self, pixels, vae, tile_px=1024, overlap_px=128, tile_batch=0):
        if _stock_reason(vae):
            return ({"samples": vae.encode_tiled(pixels, tile_x=tile_px, tile_y=tile_px, overlap=overlap_px)},)
        from fused_dit.tiling import vae as tiled_vae
        return ({"samples": tiled_vae.encode(vae, pixels, _settings(tile_px, overlap_px, tile_batch), _host(vae))},)
