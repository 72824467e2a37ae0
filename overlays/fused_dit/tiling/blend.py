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


class Profiles:
    """A plan's blend profiles as tensors, each row's and column's once: a tile's 2-D weight is the product of its
    row's and its column's (never held as a tile-sized tensor), and the weights reaching a pixel sum to the product
    of the row profiles' sum and the column profiles' sum there, since the tiles are every row with every column."""

    def __init__(self, plan: Plan, dtype: torch.dtype, device):
        self.plan, self.dtype, self.device = plan, dtype, device
        self._rows: dict[int, torch.Tensor] = {}
        self._cols: dict[int, torch.Tensor] = {}

    def row(self, index: int) -> torch.Tensor:
        if index not in self._rows:
            self._rows[index] = torch.tensor(self.plan.weights("y", index), dtype=self.dtype, device=self.device)
        return self._rows[index]

    def col(self, index: int) -> torch.Tensor:
        if index not in self._cols:
            self._cols[index] = torch.tensor(self.plan.weights("x", index), dtype=self.dtype, device=self.device)
        return self._cols[index]

    def weighted(self, tile: torch.Tensor, box: Box) -> torch.Tensor:
        """`tile` (its last two dimensions the box's) times the box's 2-D weight."""
        return tile * self.row(box.row)[:, None] * self.col(box.col)[None, :]

    def sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed row profiles over the canvas's rows, and the summed column profiles over its columns."""
        rows = torch.zeros(self.plan.height, dtype=self.dtype, device=self.device)
        cols = torch.zeros(self.plan.width, dtype=self.dtype, device=self.device)
        for index, y in enumerate(self.plan.ys):
            rows[y:y + self.row(index).shape[0]] += self.row(index)
        for index, x in enumerate(self.plan.xs):
            cols[x:x + self.col(index).shape[0]] += self.col(index)
        return rows, cols

    def normalise(self, total: torch.Tensor) -> torch.Tensor:
        """`total` (the weighted sum over the plan's canvas) divided, in place, by the summed weights."""
        rows, cols = self.sums()
        rows, cols = rows.to(total.device), cols.to(total.device)
        return total.div_(rows[:, None] * cols[None, :])


class Blender:
    """The weighted sum of `outputs` predictions over a plan's tiles, shaped and placed like `like`. `skip` names
    outputs that stay zero (ComfyUI's prediction for a conditioning of None): nothing is summed for them."""

    def __init__(self, plan: Plan, like: torch.Tensor, outputs: int, skip: frozenset = frozenset()):
        self.plan = plan
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        self.sums = [None if index in skip else torch.zeros(like.shape, dtype=dtype, device=like.device)
                     for index in range(outputs)]
        self.like = like
        self.profiles = Profiles(plan, dtype, like.device)

    def add(self, output: int, boxes: tuple[Box, ...], predictions: torch.Tensor) -> None:
        """Add the stacked predictions of a batch of tiles (as `cut` stacked them) to output `output`."""
        target = self.sums[output]
        if target is None:
            return
        rows = predictions.shape[0] // len(boxes)
        predictions = predictions.to(device=target.device, dtype=target.dtype)
        for k, box in enumerate(boxes):
            target[..., box.y0:box.y1, box.x0:box.x1] += self.profiles.weighted(predictions[k * rows:(k + 1) * rows],
                                                                                box)

    def result(self, output: int) -> torch.Tensor:
        """The blend (in place of the sums: the blender is spent for this output)."""
        if self.sums[output] is None:
            return torch.zeros_like(self.like)
        return self.profiles.normalise(self.sums[output]).to(self.like.dtype)
