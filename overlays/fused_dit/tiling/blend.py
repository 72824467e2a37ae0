"""Cutting a canvas into a plan's tiles and blending the tiles' predictions back: tensors in, tensors out.

The canvas is any tensor whose last two dimensions are the latent's rows and columns ([B, C, H, W] images,
[B, C, T, H, W] video: every frame goes with its tile). A batch of tiles is stacked tile by tile along the first
dimension, each tile's B samples together, the order ComfyUI's `repeat_to_batch_size` gives the conditionings that
are not cut (tensor.repeat repeats the whole batch), so tile k's samples are rows k*B:(k+1)*B.

The blender keeps the weighted sum of the predictions and the sum of the weights (the plan's profiles, multiplied)
and divides at the end, so the weights that reach a pixel sum to one there. Where one tile alone covers a pixel its
weight is exactly 1 and the prediction comes back bit for bit.
"""
from __future__ import annotations

import torch

from .plan import Box, Plan


def cut(canvas: torch.Tensor, boxes: tuple[Box, ...]) -> torch.Tensor:
    """The boxes of `canvas`, stacked along the first dimension (tile-major)."""
    return torch.cat([canvas[..., b.y0:b.y1, b.x0:b.x1] for b in boxes])


def cut_scaled(image: torch.Tensor, boxes: tuple[Box, ...], plan: Plan, batch: int) -> torch.Tensor:
    """The boxes of an image whose last two dimensions are the canvas's at another scale (a ControlNet hint in image
    pixels, a mask), each cut scaled to the image and repeated to `batch` rows, stacked tile-major."""
    rows, cols = image.shape[-2], image.shape[-1]
    pieces = []
    for b in boxes:
        y0, y1 = b.y0 * rows // plan.height, max(b.y0 * rows // plan.height + 1, b.y1 * rows // plan.height)
        x0, x1 = b.x0 * cols // plan.width, max(b.x0 * cols // plan.width + 1, b.x1 * cols // plan.width)
        pieces.append(repeat_rows(image[..., y0:y1, x0:x1], batch))
    return torch.cat(pieces)


def repeat_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with `rows` rows, as ComfyUI's repeat_to_batch_size makes it (cut, or repeated whole)."""
    have = tensor.shape[0]
    if have == rows:
        return tensor
    if have > rows:
        return tensor[:rows]
    return tensor.repeat((-(-rows // have),) + (1,) * (tensor.ndim - 1))[:rows]


class Blender:
    """The weighted sum of `outputs` predictions over a plan's tiles, shaped and placed like `like`. `skip` names
    outputs that stay zero (ComfyUI's prediction for a conditioning of None): nothing is summed for them."""

    def __init__(self, plan: Plan, like: torch.Tensor, outputs: int, skip: frozenset = frozenset()):
        self.plan = plan
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        self.skip = skip
        self.sums = [None if index in skip else torch.zeros(like.shape, dtype=dtype, device=like.device)
                     for index in range(outputs)]
        self.like = like
        self.out_dtype = like.dtype
        self._profiles: dict = {}
        self.dtype, self.device = dtype, like.device
        self.weight_sum = _weight_sum(plan, dtype, like.device, self.weight)

    def weight(self, box: Box) -> torch.Tensor:
        """The tile's 2-D weight: the product of its row and column profiles (1 where it alone covers a pixel)."""
        key = (box.row, box.col)
        if key not in self._profiles:
            wy = torch.tensor(self.plan.weights("y", box.row), dtype=self.dtype, device=self.device)
            wx = torch.tensor(self.plan.weights("x", box.col), dtype=self.dtype, device=self.device)
            self._profiles[key] = wy[:, None] * wx[None, :]
        return self._profiles[key]

    def add(self, output: int, boxes: tuple[Box, ...], predictions: torch.Tensor) -> None:
        """Add the stacked predictions of a batch of tiles (as `cut` stacked them) to output `output`."""
        target = self.sums[output]
        if target is None:
            return
        rows = predictions.shape[0] // len(boxes)
        predictions = predictions.to(device=target.device, dtype=target.dtype)
        for k, box in enumerate(boxes):
            target[..., box.y0:box.y1, box.x0:box.x1].addcmul_(predictions[k * rows:(k + 1) * rows], self.weight(box))

    def result(self, output: int) -> torch.Tensor:
        """The blend (in place of the sums: the blender is spent for this output)."""
        if self.sums[output] is None:
            return torch.zeros_like(self.like)
        return self.sums[output].div_(self.weight_sum).to(self.out_dtype)


# the summed weights of the last plans blended (a sampling run calls the blender once per model call, same plan)
_WEIGHT_SUMS: dict = {}


def _weight_sum(plan: Plan, dtype, device, weight) -> torch.Tensor:
    key = (id(plan), dtype, str(device))
    held = _WEIGHT_SUMS.get(key)
    if held is not None and held[0] is plan:
        return held[1]
    total = torch.zeros((plan.height, plan.width), dtype=dtype, device=device)
    for box in plan.boxes:
        total[box.y0:box.y1, box.x0:box.x1] += weight(box)
    _WEIGHT_SUMS.clear()                 # one plan at a time: a run's canvas, never a growing cache
    _WEIGHT_SUMS[key] = (plan, total)
    return total
