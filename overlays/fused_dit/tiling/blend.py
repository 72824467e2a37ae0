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
    """The weighted sum of `outputs` predictions over a plan's tiles, shaped and placed like `like`."""

    def __init__(self, plan: Plan, like: torch.Tensor, outputs: int):
        self.plan = plan
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        self.sums = [torch.zeros(like.shape, dtype=dtype, device=like.device) for _ in range(outputs)]
        self.out_dtype = like.dtype
        self._profiles: dict = {}
        self.weight_sum = torch.zeros(like.shape[-2:], dtype=dtype, device=like.device)
        for box in plan.boxes:
            self.weight_sum[box.y0:box.y1, box.x0:box.x1] += self.weight(box)

    def weight(self, box: Box) -> torch.Tensor:
        """The tile's 2-D weight: the product of its row and column profiles (1 where it alone covers a pixel)."""
        key = (box.row, box.col)
        if key not in self._profiles:
            sums = self.sums[0] if self.sums else self.weight_sum
            wy = torch.tensor(self.plan.weights("y", box.row), dtype=sums.dtype, device=sums.device)
            wx = torch.tensor(self.plan.weights("x", box.col), dtype=sums.dtype, device=sums.device)
            self._profiles[key] = wy[:, None] * wx[None, :]
        return self._profiles[key]

    def add(self, output: int, boxes: tuple[Box, ...], predictions: torch.Tensor) -> None:
        """Add the stacked predictions of a batch of tiles (as `cut` stacked them) to output `output`."""
        rows = predictions.shape[0] // len(boxes)
        target = self.sums[output]
        for k, box in enumerate(boxes):
            piece = predictions[k * rows:(k + 1) * rows].to(device=target.device, dtype=target.dtype)
            target[..., box.y0:box.y1, box.x0:box.x1] += piece * self.weight(box)

    def result(self, output: int) -> torch.Tensor:
        return (self.sums[output] / self.weight_sum).to(self.out_dtype)
