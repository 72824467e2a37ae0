"""Tiled sampling on ComfyUI's CALC_COND_BATCH seam: every model call of a sampler runs tile by tile.

ComfyUI's `calc_cond_batch(model, conds, x_in, timestep, model_options)` turns the latent and the conditionings into
model calls (cond and uncond batched, ControlNets run, areas and masks applied) and returns one prediction per
conditioning, shaped like the latent. `tiled_calc_cond_batch` is a wrapper on that seam (the hook ComfyUI's own
wrappers use, WrappersMP.CALC_COND_BATCH): it plans the canvas's tiles (plan.py), then hands each batch of tiles to
the rest of the chain as if it were the whole latent - tiles stacked along the batch, the timestep repeated, every
spatial conditioning cut to the same boxes - and blends what comes back (blend.py). Everything below the seam runs
as it does untiled, tile-sized: ControlNets on their hint cut to the tile, the model's own positions per tile,
ComfyUI's memory-fit batching of cond and uncond, other nodes' APPLY_MODEL wrappers (the Fused DiT Ops node's
kernel families run in every tile that way).

What is cut, in each conditioning (`conds[i][j]`): `model_conds` values holding a tensor (or a list of tensors, as
reference latents are) whose last two dimensions are the latent's (inpaint concat latents, reference latents of the
canvas's size: Qwen-Image-Edit's and Flux.2's reference images; one of another size goes whole to every tile, said
once); a `mask` (resized to the latent by the sampler already); each ControlNet's hint (and its extra
concat images) for the length of the call, cut at its own scale. An `area` conditioning (ConditioningSetArea) names
latent coordinates of the whole canvas: such a run stays untiled, said once.
"""
from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from .. import state
from .blend import Blender, cut, cut_scaled, repeat_rows
from .devices import spread
from .plan import Box, Plan, PlanError


@dataclass
class Progress:
    """What the wrapper reports after each batch and asks before the next (ComfyUI's progress bar and Cancel)."""
    advance: Callable[[int, int], None] = lambda tiles, total: None     # tiles done, tiles in this call
    check_cancel: Callable[[], None] = lambda: None                      # raises to stop between two batches


def untiled_reason(conds: list) -> str | None:
    """Why this call cannot be tiled (None: it can)."""
    for cond in conds:
        for entry in cond or ():
            if "area" in entry:
                return ("an area conditioning (ConditioningSetArea) names coordinates of the whole canvas: "
                        "this run stays untiled")
    return None


def tiled_calc_cond_batch(executor, model, conds: list, x_in: torch.Tensor, timestep: torch.Tensor,
                          model_options: dict, *, plan_for: Callable[[torch.Tensor], tuple[Plan, int]],
                          progress: Progress | None = None, device: torch.device | None = None,
                          devices: list | None = None, pool=None):
    """The CALC_COND_BATCH wrapper's body; `plan_for(x_in)` gives (plan, tiles per batch) for this latent. Each
    batch of tiles runs on `device` (the model's; the canvas's own where None) and is blended where the canvas is.
    `devices`: (device, executor-like call for that device's model clone) pairs; with two or more the batches are
    spread over them (devices.py, on `pool`'s threads where it is ComfyUI's and covers them), blended in plan order."""
    progress = progress or Progress()
    reason = untiled_reason(conds)
    if reason:
        state.say_once("Tiled Sampling: %s", reason)
        return executor(model, conds, x_in, timestep, model_options)
    try:
        layout, per_batch = plan_for(x_in)
    except PlanError as error:
        state.say_once("Tiled Sampling: this canvas stays untiled: %s", str(error), level=logging.WARNING)
        return executor(model, conds, x_in, timestep, model_options)
    if layout.single:
        return executor(model, conds, x_in, timestep, model_options)
    rows = x_in.shape[0]
    blender = Blender(layout, x_in, len(conds), skip=frozenset(i for i, cond in enumerate(conds) if cond is None))
    if devices is not None and len(devices) > 1:
        if not _controls(conds):
            return _on_devices(devices, pool, model, conds, x_in, timestep, model_options, layout, per_batch,
                               blender, progress)
        state.say_once("Tiled Sampling: a ControlNet's hint is cut in place for each batch: the batches of tiles "
                       "are not spread over the multi-GPU clones")
    done = 0
    for boxes in layout.batches(per_batch):
        progress.check_cancel()
        tiles = len(boxes)
        cut_conds = _cut_conds(conds, boxes, layout, rows)
        with _hints_cut(conds, boxes, layout, rows):
            outputs = executor(model, cut_conds, cut(x_in, boxes).to(device or x_in.device),
                               timestep.repeat(tiles).to(device or timestep.device), model_options)
        for index, predicted in enumerate(outputs):
            blender.add(index, boxes, predicted)
        done += tiles
        progress.advance(done, layout.count)
    return [blender.result(index) for index in range(len(conds))]


def _on_devices(devices: list, pool, model, conds: list, x_in: torch.Tensor, timestep: torch.Tensor,
                model_options: dict, layout: Plan, per_batch: int, blender: Blender, progress: Progress) -> list:
    """The batches over several devices: each cut and run on a worker's thread, blended here in plan order."""
    rows = x_in.shape[0]

    def runner(device: torch.device, call):
        def run(boxes):
            return call(model, _cut_conds(conds, boxes, layout, rows), cut(x_in, boxes).to(device),
                        timestep.repeat(len(boxes)).to(device), model_options)
        return run

    def blend(boxes, outputs) -> None:
        for index, predicted in enumerate(outputs):
            blender.add(index, boxes, predicted)

    done = [0]

    def advance(tiles: int) -> None:
        done[0] += tiles
        progress.advance(done[0], layout.count)

    spread(layout.batches(per_batch), [(torch.device(d), runner(torch.device(d), call)) for d, call in devices],
           blend, advance=advance, check_cancel=progress.check_cancel, pool=pool)
    return [blender.result(index) for index in range(len(conds))]


# ---------------------------------------------------------------------------------------------- the conditionings
def _is_canvas(tensor, layout: Plan) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.ndim >= 3 and tuple(tensor.shape[-2:]) == (layout.height,
                                                                                                  layout.width)


def _cut_latent(tensor: torch.Tensor, boxes: tuple[Box, ...], rows: int) -> torch.Tensor:
    return cut(repeat_rows(tensor, rows), boxes)


def _cut_value(value, boxes: tuple[Box, ...], layout: Plan, rows: int):
    """A model_conds value with its canvas-shaped tensors cut to the boxes (a copy; the original is untouched)."""
    held = getattr(value, "cond", None)
    if isinstance(held, list):
        _say_references(held, layout)
    if _is_canvas(held, layout):
        new = _cut_latent(held, boxes, rows)
    elif isinstance(held, list) and any(_is_canvas(t, layout) for t in held):
        new = [_cut_latent(t, boxes, rows) if _is_canvas(t, layout) else t for t in held]
    else:
        return value
    if hasattr(value, "_copy_with"):
        return value._copy_with(new)
    twin = copy.copy(value)
    twin.cond = new
    return twin


def _say_references(held: list, layout: Plan) -> None:
    """Once each: reference latents (Qwen-Image-Edit's and Flux.2's reference images, a list of latents in
    model_conds) of the canvas's size are cut with the tile; others go whole to every tile."""
    latents = [t for t in held if isinstance(t, torch.Tensor) and t.ndim >= 4]
    if any(_is_canvas(t, layout) for t in latents):
        state.say_once("Tiled Sampling: reference latents of the canvas's size are cut to each tile, so that a "
                       "tile sees the part of the reference it covers")
    if any(not _is_canvas(t, layout) for t in latents):
        state.say_once("Tiled Sampling: reference latents of another size than the canvas go whole to every tile "
                       "(each tile sees the whole reference)")


def _cut_conds(conds: list, boxes: tuple[Box, ...], layout: Plan, rows: int) -> list:
    """Every conditioning's entries cut to the boxes (None stays None)."""
    return [None if cond is None else [_cut_entry(entry, boxes, layout, rows) for entry in cond] for cond in conds]


def _cut_entry(entry: dict, boxes: tuple[Box, ...], layout: Plan, rows: int) -> dict:
    out = dict(entry)
    if "model_conds" in entry:
        out["model_conds"] = {key: _cut_value(value, boxes, layout, rows)
                              for key, value in entry["model_conds"].items()}
    mask = entry.get("mask")
    if isinstance(mask, torch.Tensor) and mask.ndim >= 2:
        out["mask"] = cut_scaled(mask, boxes, layout, rows)
    return out


def _controls(conds: list) -> list:
    """Every ControlNet object the conditionings reach, each once, previous ones in a chain included."""
    seen: dict[int, object] = {}
    for cond in conds:
        for entry in cond or ():
            control = entry.get("control")
            while control is not None and id(control) not in seen:
                seen[id(control)] = control
                control = getattr(control, "previous_controlnet", None)
    return list(seen.values())


@contextlib.contextmanager
def _hints_cut(conds: list, boxes: tuple[Box, ...], layout: Plan, rows: int):
    """For the length of one call, each ControlNet's hint (and extra concat images) cut to the boxes, its cached
    resized hint dropped so that it resizes the cut; everything put back after, the cache dropped again."""
    saved = []
    try:
        for control in _controls(conds):
            hint = getattr(control, "cond_hint_original", None)
            extra = getattr(control, "extra_concat_orig", None)
            if not isinstance(hint, torch.Tensor) or hint.ndim < 4:
                continue
            saved.append((control, hint, extra))
            control.cond_hint_original = cut_scaled(hint, boxes, layout, rows)
            if extra:
                control.extra_concat_orig = [cut_scaled(e, boxes, layout, rows)
                                             if isinstance(e, torch.Tensor) and e.ndim >= 3 and min(e.shape[-2:]) > 1
                                             else e for e in extra]
            control.cond_hint = None
        yield
    finally:
        for control, hint, extra in saved:
            control.cond_hint_original = hint
            if extra is not None:
                control.extra_concat_orig = extra
            control.cond_hint = None
