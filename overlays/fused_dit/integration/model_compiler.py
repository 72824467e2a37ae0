"""ComfyUI's model compiler (0.34+, `comfy/model_prefetch.py`) as the pack meets it.

Where a model opts in (Qwen-Image 2.1 and others in the newest releases), the compiler records every allocation a
KSampler call's first forward makes, block by block, in a comfy-aimdo malloc graph, and replays that record on the
forwards after it: a forward whose allocations differ from the record is a graph break (an error under
`--assert-graph-breaks`). A family that does something once, on a shape's first call (the attention family measures
its backends; cuDNN's FP8 SDPA builds its graph and workspace; FP8 codes kept between calls are quantised), does it
inside `outside_recorded_allocations()`: the release's own `pause_malloc_graph()`, so the record holds only what every
forward allocates alike. On a release without the compiler, or with it off, that is a context that does nothing.

The compiler captures a block in a CUDA graph on its second call, so a shape's first call is eager; a shape first
seen while a stream is capturing (`capturing`) is not measured there (timing syncs the host, which ends a capture):
it runs without the choice this once and is measured on its next eager call.
"""
from __future__ import annotations

import contextlib
import sys

import torch

PREFETCH_MODULE = "comfy.model_prefetch"


def outside_recorded_allocations():
    """A context in which allocations stay out of the compiler's malloc graph (nothing where there is none)."""
    pause = getattr(sys.modules.get(PREFETCH_MODULE), "pause_malloc_graph", None)
    return pause() if callable(pause) else contextlib.nullcontext()


def capturing(tensor: torch.Tensor) -> bool:
    """Whether the current CUDA stream of `tensor`'s device is capturing a CUDA graph (False off CUDA)."""
    return tensor.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
