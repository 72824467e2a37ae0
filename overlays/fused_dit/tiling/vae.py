"""A tiled VAE that runs once: encode and decode of a large canvas in one pass of equal tiles, batched.

ComfyUI's VAEEncodeTiled and VAEDecodeTiled (comfy/sd.py, for 2-D latents) run three full tiled passes of different
tile shapes, one tile at a time, and average them. Here the canvas is cut once, with the sampler's planner
(plan.py: tiles spread evenly, the last flush with the edge, so every tile has the same shape), equal tiles go
through the VAE's own encoder or decoder together, and each tile's output is blended with the plan's profiles at
the output's scale (`plan.scaled`): a quarter of the overlap at each tile's edge gets no weight, so a convolution-
only VAE whose reach is within it gives the untiled result to fp32 rounding.

Memory tracks a batch of tiles: ComfyUI's own estimate for one tile (`vae.memory_used_decode` / `_encode`) loads
the VAE and sizes the batch in the memory ComfyUI reports free; the canvas stays where ComfyUI keeps VAE outputs
(`vae.output_device`, the host unless --gpu-only), in float32, and each tile is weighted on the GPU before it moves
there. The VAE's output processing (`process_output`) runs on the blended canvas in strips of rows.

`Host` is what this needs of ComfyUI (model loading, free memory, the device context, a progress bar, Cancel), so
that the arithmetic here runs without it (tests). A VAE this path does not fit (a video or audio VAE, one that tiles
itself) is for the node to hand to ComfyUI's own tiled call: `unsupported(vae)` says why.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from .blend import Profiles, cut
from .plan import Box, Plan, choose_batch, margin_for, plan, scaled

ROWS_PER_STRIP = 256          # rows of the output canvas that `process_output` sees at once


@dataclass(frozen=True)
class TileSettings:
    tile_px: int = 1024       # a tile's side in image pixels
    overlap_px: int = 128
    batch: int = 0            # tiles in one call; 0: as many as ComfyUI's estimate fits, at most max_batch
    max_batch: int = 8


@dataclass
class Host:
    """ComfyUI's side of a tiled VAE call (see the module docstring)."""
    load: Callable[[int], None] = lambda memory_required: None
    free_memory: Callable[[], int] = lambda: 2 ** 34
    device_context: Callable[[], object] = contextlib.nullcontext
    progress: Callable[[int], Callable[[int], None]] = lambda total: (lambda done: None)
    check_cancel: Callable[[], None] = lambda: None


def unsupported(vae) -> str | None:
    """Why the one-pass path cannot run this VAE (None: it can)."""
    if getattr(vae, "first_stage_model", None) is None:
        return "the VAE holds no model"
    if getattr(vae, "latent_dim", 2) != 2:
        return "a video or audio VAE (its latent is not 2-D)"
    if getattr(vae, "extra_1d_channel", None) is not None or getattr(vae, "handles_tiling", False):
        return "a VAE that tiles itself"
    if getattr(vae.first_stage_model, "comfy_has_chunked_io", False):
        return "a VAE with ComfyUI's chunked input and output"
    return None


def latent_plan(height: int, width: int, factor: int, settings: TileSettings) -> Plan:
    """The tiles of a height x width latent for tiles of `settings.tile_px` image pixels (the overlap at most half
    a tile, the margin a quarter of the overlap)."""
    tile = max(1, settings.tile_px // factor)
    overlap = min(settings.overlap_px // factor, tile // 2)
    return plan(height, width, tile, overlap, margin=margin_for(overlap))


def _batch(settings: TileSettings, host: Host, per_tile: int, count: int) -> int:
    if settings.batch:
        return max(1, min(settings.batch, count))
    return choose_batch(host.free_memory(), max(1, int(per_tile)), count, settings.max_batch)


def _scaled_box(box: Box, factor: int) -> Box:
    return Box(box.y0 * factor, box.y1 * factor, box.x0 * factor, box.x1 * factor, box.row, box.col)


def _one_pass(layout: Plan, scale: int, batch: int, host: Host, rows: int, vae, tiles_of, call) -> torch.Tensor:
    """Every batch of `layout`'s tiles through `call(tiles_of(boxes))`, each output tile weighted with the plan's
    profiles at `scale` times the layout's size and added to a float32 canvas on the VAE's output device; the
    blend, normalised."""
    out_plan = scaled(layout, scale) if scale != 1 else layout
    profiles = Profiles(out_plan, torch.float32, vae.device)
    canvas = None
    advance = host.progress(layout.count)
    done = 0
    for boxes in layout.batches(batch):
        host.check_cancel()
        out = call(tiles_of(boxes))
        if canvas is None:
            canvas = torch.zeros((rows, out.shape[1], out_plan.height, out_plan.width), dtype=torch.float32,
                                 device=vae.output_device)
        for k, box in enumerate(boxes):
            place = _scaled_box(box, scale)
            weighted = profiles.weighted(out[k * rows:(k + 1) * rows].float(), place)
            canvas[..., place.y0:place.y1, place.x0:place.x1] += weighted.to(canvas.device)
        done += len(boxes)
        advance(done)
        del out
    return profiles.normalise(canvas)


def decode(vae, latent: torch.Tensor, settings: TileSettings = TileSettings(), host: Host | None = None
           ) -> torch.Tensor:
    """ComfyUI's IMAGE ([B, H, W, C], the VAE's output dtype, on its output device) of a [B, C, h, w] latent."""
    host = host or Host()
    if latent.ndim == 5:
        latent = latent[:, :, 0]
    rows, channels, height, width = latent.shape
    factor = int(vae.spacial_compression_decode())
    layout = latent_plan(height, width, factor, settings)
    first = layout.boxes[0]
    per_tile = vae.memory_used_decode((rows, channels, first.y1 - first.y0, first.x1 - first.x0), vae.vae_dtype)
    host.load(int(per_tile) * (settings.batch or settings.max_batch))
    batch = _batch(settings, host, per_tile, layout.count)
    with host.device_context(), torch.inference_mode():
        canvas = _one_pass(layout, factor, batch, host, rows, vae,
                           lambda boxes: cut(latent, boxes).to(device=vae.device, dtype=vae.vae_dtype),
                           vae.first_stage_model.decode)
        for y in range(0, canvas.shape[-2], ROWS_PER_STRIP):
            strip = canvas[..., y:y + ROWS_PER_STRIP, :]
            strip.copy_(vae.process_output(strip))
    return canvas.to(vae.vae_output_dtype()).movedim(1, -1)


def encode(vae, pixels: torch.Tensor, settings: TileSettings = TileSettings(), host: Host | None = None
           ) -> torch.Tensor:
    """The latent ([B, C, h, w], the VAE's output dtype, on its output device) of ComfyUI's IMAGE [B, H, W, C]."""
    host = host or Host()
    pixels = vae.vae_encode_crop_pixels(pixels)
    rows, height_px, width_px = pixels.shape[0], pixels.shape[1], pixels.shape[2]
    factor = int(vae.spacial_compression_encode())
    layout = latent_plan(height_px // factor, width_px // factor, factor, settings)
    first = layout.boxes[0]
    tile_shape = (rows, pixels.shape[-1], (first.y1 - first.y0) * factor, (first.x1 - first.x0) * factor)
    per_tile = vae.memory_used_encode(tile_shape, vae.vae_dtype)
    host.load(int(per_tile) * (settings.batch or settings.max_batch))
    batch = _batch(settings, host, per_tile, layout.count)

    def tiles_of(boxes):
        places = [_scaled_box(box, factor) for box in boxes]
        tiles = torch.cat([pixels[:, p.y0:p.y1, p.x0:p.x1, :] for p in places]).to(vae.device)
        return vae.process_input(tiles.movedim(-1, 1)).to(vae.vae_dtype)

    with host.device_context(), torch.inference_mode():
        canvas = _one_pass(layout, 1, batch, host, rows, vae, tiles_of, vae.first_stage_model.encode)
    samples = canvas.to(vae.vae_output_dtype())
    if getattr(vae, "format_encoded", None) is not None:
        samples = vae.format_encoded(samples)
    return samples
