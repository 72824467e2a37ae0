"""Tiles of a latent canvas, their blend weights, and how many run at once: pure arithmetic, no torch.

One code path predicts and plans: the Tiled Sampling node plans its tiles here at every sampling run, and
`applier budget` loads this file by path (it imports nothing outside the standard library) to price the same route.

- `plan(height, width, tile, overlap, ...)` -> a `Plan`: the tile boxes of a canvas in latent pixels, row by row.
  Along each side, tiles start `tile - overlap` apart at most (spread evenly, aligned to the model's patch), the first
  at 0 and the last flush with the canvas's end, so neighbours overlap by `overlap` or more and every pixel is in a
  tile. A side no longer than a tile is one tile as long as the side.
- `Plan.weights(axis, index)`: a tile's blend profile along one side. 1 inside; where it overlaps a neighbour, zero
  for `margin` pixels from its own edge, then a linear ramp whose values and the neighbour's add up to exactly one
  (as fractions; `exact=True` gives `Fraction`s); 1 at the canvas's own edges. A tile's 2-D weight is the product of
  its two profiles. The blender divides the weighted sum by the summed weights, so the weights that reach a pixel sum
  to one there however many tiles meet (ramps that cross, a last tile pushed back to the edge).
- `ModelShape` and `choose`: the memory model of `applier budget` (one forward's peak activations are
  `activation_widths x hidden x tokens x 2` bytes, fused_dit/models.json) for one tile, and the batch of tiles
  that fits beside the model in the free memory.
- `scaled(plan, factor)`: the same tiles at another scale (a latent plan in image pixels: the tiled VAE blends its
  pixels with the weights of the sampler's tiles, `factor` times finer).

Seamless by default: a model call on a tile computes the tile's edge pixels without their neighbours. The planned
margin (`margin_for`: a quarter of the overlap, whole latent pixels) gives those pixels no weight where a neighbour
covers them, so a model whose reach is at most the margin (a convolution, a VAE's decoder up to its reach) gives the
untiled result to rounding, and a DiT's outermost tokens of a tile, which saw the least context, never show.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

BF16_BYTES = 2
# a tile side in image pixels is whole tokens: the VAE's 8 pixels x the 2x2 patch of every model the node tiles
TILE_MULTIPLE = 16
# the planned margin: this share of the overlap, in whole latent pixels
MARGIN_SHARE = 4


class PlanError(ValueError):
    """Settings no canvas can be tiled with (the node reports it in ComfyUI's validation)."""


# ------------------------------------------------------------------------------------------------------- the grid
def axis_starts(length: int, tile: int, overlap: int, align: int = 1) -> tuple[int, ...]:
    """Where the tiles along one side start: 0, then at most `tile - overlap` apart, the last at `length - tile`.
    Starts other than the last are multiples of `align` (the model's patch: a tile's own grid of tokens then lines up
    with its neighbours'); where the overlap leaves less than `align` between starts, they are not aligned)."""
    if length <= tile:
        return (0,)
    stride = tile - overlap
    align = align if align <= stride else 1
    count = math.ceil((length - overlap) / stride)
    last = length - tile
    while True:
        starts = sorted({min(last, (k * last // (count - 1)) // align * align) for k in range(count - 1)} | {last})
        if all(b - a <= stride for a, b in zip(starts, starts[1:])):
            return tuple(starts)
        count += 1


def axis_profile(length: int, starts: tuple[int, ...], tile: int, index: int, margin: int = 0,
                 exact: bool = False) -> list:
    """The blend profile of tile `index` along one side (see the module docstring), one value per pixel of the tile."""
    one = Fraction(1) if exact else 1.0
    size = min(tile, length)
    start = starts[index]
    profile = [one] * size
    if index > 0:                                 # the neighbour before ends at starts[index - 1] + size
        _ramp(profile, starts[index - 1] + size - start, margin, one, rising=True)
    if index < len(starts) - 1:
        _ramp(profile, start + size - starts[index + 1], margin, one, rising=False)
    return profile


def _ramp(profile: list, overlap: int, margin: int, one, rising: bool) -> None:
    """Multiply the overlap's end of `profile` by 0 over `margin` pixels, then (k + 1) / (span + 1) over the
    `span = overlap - 2 margin` pixels between (falling at the far end); the neighbour's ramp is the complement."""
    span = overlap - 2 * margin
    size = len(profile)
    for k in range(min(overlap, size)):
        if k < margin:
            value = 0 * one
        elif k < margin + span:
            value = one * (k - margin + 1) / (span + 1)
        else:
            break
        at = k if rising else size - 1 - k
        profile[at] = profile[at] * value


@dataclass(frozen=True)
class Box:
    """One tile in latent pixels: rows y0:y1, columns x0:x1 (ends exclusive), and its place in the grid."""
    y0: int
    y1: int
    x0: int
    x1: int
    row: int
    col: int


@dataclass(frozen=True)
class Plan:
    height: int
    width: int
    tile: int                     # latent pixels per side (a side shorter than this is one tile of its length)
    overlap: int
    margin: int
    ys: tuple[int, ...]
    xs: tuple[int, ...]
    boxes: tuple[Box, ...] = field(repr=False)

    @property
    def count(self) -> int:
        return len(self.boxes)

    @property
    def single(self) -> bool:
        """One tile covers the canvas: the model is called as without tiling."""
        return self.count == 1

    def weights(self, axis: str, index: int, exact: bool = False) -> list:
        """Tile `index`'s profile along "y" (rows) or "x" (columns)."""
        length, starts = (self.height, self.ys) if axis == "y" else (self.width, self.xs)
        return axis_profile(length, starts, self.tile, index, self.margin, exact)

    def batches(self, size: int) -> list[tuple[Box, ...]]:
        """The boxes in runs of `size` (the last may be shorter), in row order."""
        size = max(1, size)
        return [self.boxes[k:k + size] for k in range(0, self.count, size)]


def scaled(layout: Plan, factor: int) -> Plan:
    """`layout`'s tiles, overlap and margin `factor` times larger (its profiles then ramp over `factor` times the
    pixels): the image-pixel plan of a latent plan."""
    boxes = tuple(Box(b.y0 * factor, b.y1 * factor, b.x0 * factor, b.x1 * factor, b.row, b.col) for b in layout.boxes)
    return Plan(layout.height * factor, layout.width * factor, layout.tile * factor, layout.overlap * factor,
                layout.margin * factor, tuple(y * factor for y in layout.ys), tuple(x * factor for x in layout.xs),
                boxes)


def margin_for(overlap: int) -> int:
    """The planned margin of an overlap (both in latent pixels): a quarter of it, so that the ramp between two
    margins is half the overlap."""
    return overlap // MARGIN_SHARE


def plan(height: int, width: int, tile: int, overlap: int, align: int = 1, margin: int = 0) -> Plan:
    """The tiles of a height x width latent canvas (see the module docstring); PlanError for settings no canvas can
    be tiled with."""
    problem = settings_problem(tile, overlap, align, margin)
    if problem:
        raise PlanError(problem)
    if height < 1 or width < 1:
        raise PlanError(f"an empty canvas ({height} x {width} latent pixels)")
    ys, xs = axis_starts(height, tile, overlap, align), axis_starts(width, tile, overlap, align)
    th, tw = min(tile, height), min(tile, width)
    boxes = tuple(Box(y, y + th, x, x + tw, r, c) for r, y in enumerate(ys) for c, x in enumerate(xs))
    return Plan(height, width, tile, overlap, margin, ys, xs, boxes)


def settings_problem(tile: int, overlap: int, align: int = 1, margin: int = 0) -> str | None:
    """Why a tile and overlap (in latent pixels) cannot tile any canvas, or None."""
    if tile < 1:
        return f"the tile must be at least 1 latent pixel (got {tile})"
    if align > 1 and tile % align:
        return f"the tile ({tile} latent pixels) must be a multiple of the model's patch ({align})"
    if overlap < 0:
        return f"the overlap must not be negative (got {overlap})"
    if overlap >= tile:
        return f"the overlap ({overlap}) must be smaller than the tile ({tile})"
    if 2 * overlap > tile:
        return (f"the overlap ({overlap}) must be at most half the tile ({tile}): wider, three or more tiles meet at "
                "a pixel and each step runs several times the model calls for the same canvas")
    if margin < 0 or 2 * margin > overlap:
        return f"the margin ({margin}) must be between 0 and half the overlap ({overlap})"
    return None


def pixel_settings_problem(tile_px: int, overlap_px: int, multiple: int = TILE_MULTIPLE,
                           margin_px: int = -1) -> str | None:
    """The node's inputs checked in image pixels, planned values resolved (no 0 / -1 left); None when fine."""
    if tile_px % multiple:
        return (f"tile_px {tile_px} is not a multiple of {multiple} (the VAE's 8 pixels x the model's 2x2 patch); "
                f"try {max(multiple, tile_px // multiple * multiple)}")
    if overlap_px % 8:
        return f"overlap_px {overlap_px} is not a multiple of 8 (one latent pixel is 8 image pixels)"
    if 2 * overlap_px > tile_px:
        return (f"overlap_px {overlap_px} must be at most half of tile_px {tile_px}: give a tile_px of at least "
                f"{2 * overlap_px} or an overlap_px of at most {tile_px // 2 // 8 * 8}")
    if margin_px >= 0 and (margin_px % 8 or 2 * margin_px > overlap_px):
        return (f"margin_px {margin_px} must be a multiple of 8 and at most half of overlap_px {overlap_px} "
                f"(at most {overlap_px // 2 // 8 * 8})")
    return None


# --------------------------------------------------------------------------------------------- memory and batching
@dataclass(frozen=True)
class ModelShape:
    """What planning needs of a model (an entry of the pack's model table, fused_dit/models.json, which applier
    budget prices from too)."""
    key: str
    patch: int                    # latent pixels per token side
    vae_factor: int               # image pixels per latent pixel
    hidden: int
    activation_widths: float
    text_tokens: int
    text_in_stream: bool          # joint attention: the text tokens ride in every tile's stream (Flux, Qwen-Image)
    tile_px: int                  # the planned tile: a size the model was trained at
    overlap_px: int
    max_batch: int                # beyond this, batching measured no faster (results key in the table)
    # what the model is, as ComfyUI builds it (its model config): the node tiles a model only where all match
    image_model: str = ""         # supported_models' unet_config["image_model"]
    latent_channels: int = 0      # the latent format's channels
    config_width: tuple = ()      # (unet_config key, value) pairs the config must hold (its width, where stated)
    name: str = ""                # the model's name in the user's words
    classes: tuple = ()           # the diffusion model classes ComfyUI builds it on (a class alone never decides)

    def tokens(self, tile_px: int, frames: int = 1) -> int:
        side = math.ceil(tile_px / self.vae_factor / self.patch)
        return side * side * frames + (self.text_tokens if self.text_in_stream else 0)

    def tile_bytes(self, tile_px: int, frames: int = 1) -> int:
        """One tile's peak activations in one forward (applier budget's activation_bytes at the tile)."""
        return int(self.activation_widths * self.hidden * self.tokens(tile_px, frames) * BF16_BYTES)


def choose_batch(free_bytes: int, per_tile_bytes: int, tiles: int, max_batch: int) -> int:
    """How many tiles run in one forward: as many as fit in `free_bytes`, at most `max_batch` and `tiles`, at least 1."""
    fits = free_bytes // per_tile_bytes if per_tile_bytes > 0 else max_batch
    return max(1, min(int(fits), max_batch, tiles))


@dataclass(frozen=True)
class Settings:
    tile_px: int
    overlap_px: int
    batch: int
    plan: Plan
    tile_bytes: int
    planned: tuple[str, ...]      # which of tile / overlap / batch were planned rather than given


def resolve(tile_px: int, overlap_px: int, margin_px: int, default_tile_px: int, default_overlap_px: int,
            vae_factor: int = 8) -> tuple[int, int, int]:
    """The node's tile, overlap and margin in image pixels with the planned ones (0 / -1 / -1) filled in: the
    model's tile and overlap (the overlap at most half the tile), the margin a quarter of the overlap in whole
    latent pixels."""
    tile_px = tile_px or default_tile_px
    if overlap_px == -1:
        overlap_px = min(default_overlap_px, tile_px // 2 // vae_factor * vae_factor)
    if margin_px == -1:
        margin_px = margin_for(overlap_px // vae_factor) * vae_factor
    return tile_px, overlap_px, margin_px


def on_grid(model: ModelShape, tile_px: int, overlap_px: int, margin_px: int) -> tuple[int, int, int, tuple]:
    """Settings the node's validation let through (16 px steps, 8 px overlaps) on a model whose token or latent
    pixel is larger (Wan 2.2 5B's 32 px tokens, HunyuanImage 2.1's 32 px latent pixels), rounded down onto its grid,
    and what was rounded, in words (the run's one line says it)."""
    token, latent = model.vae_factor * model.patch, model.vae_factor
    new_tile = max(token, tile_px // token * token)
    new_overlap = overlap_px // latent * latent
    new_margin = min(margin_px // latent * latent, new_overlap // 2 // latent * latent)
    rounded = tuple(f"{what} {old} -> {new} px (the model's grid)" for what, old, new in (
        ("tile", tile_px, new_tile), ("overlap", overlap_px, new_overlap), ("margin", margin_px, new_margin))
        if old != new)
    return new_tile, new_overlap, new_margin, rounded


def choose(model: ModelShape, latent_height: int, latent_width: int, free_bytes: int, *, tile_px: int = 0,
           overlap_px: int = -1, batch: int = 0, frames: int = 1, margin_px: int = -1) -> Settings:
    """Tile, overlap, margin and batch for one canvas: each given one kept, the others planned (tile and overlap
    from the model's table, the margin from the overlap, batch from the free memory); PlanError for settings that
    cannot tile."""
    planned = tuple(name for name, value, auto in (("tile", tile_px, 0), ("overlap", overlap_px, -1),
                                                   ("margin", margin_px, -1), ("batch", batch, 0)) if value == auto)
    tile_px, overlap_px, margin_px = resolve(tile_px, overlap_px, margin_px, model.tile_px, model.overlap_px,
                                             model.vae_factor)
    tile_px, overlap_px, margin_px, rounded = on_grid(model, tile_px, overlap_px, margin_px)
    planned += rounded
    problem = pixel_settings_problem(tile_px, overlap_px, model.vae_factor * model.patch, margin_px)
    if problem:
        raise PlanError(problem)
    layout = plan(latent_height, latent_width, tile_px // model.vae_factor, overlap_px // model.vae_factor,
                  align=model.patch, margin=margin_px // model.vae_factor)
    tile_side_px = max(layout.boxes[0].y1 - layout.boxes[0].y0, layout.boxes[0].x1 - layout.boxes[0].x0)
    per_tile = model.tile_bytes(tile_side_px * model.vae_factor, frames)
    chosen = batch or choose_batch(free_bytes, per_tile, layout.count, model.max_batch)
    return Settings(tile_px, overlap_px, max(1, min(chosen, layout.count)), layout, per_tile, planned)
