"""Tiled sampling: the canvas cut into tiles at every model call, so that VRAM tracks a tile, not the canvas.

    plan.py      pure: tile boxes, blend profiles, the memory model and the batch (no torch; applier budget loads it)
    models.py    the models the node tiles, with what planning needs of each (no torch)
    blend.py     tensors: cut a canvas into a plan's tiles, blend the tiles' predictions back
    sampling.py  the CALC_COND_BATCH wrapper's body: tiles through the rest of ComfyUI's chain, conditionings cut
    devices.py   batches of tiles over several devices (ComfyUI's multi-GPU clones) by measured speed, in plan order
    wrappers.py  the node's hooks on a ModelPatcher: the run's plan, the canvas's place, progress, Cancel

Importing this package imports no torch (the node module reads plan.py's checks in a bare interpreter).
"""
