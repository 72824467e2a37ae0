"""ComfyUI's model compiler (0.34+, `comfy/model_prefetch.py`) as the pack meets it.

Where a model opts in (Qwen-Image 2.1 and others in the newest releases), the compiler records every allocation a
KSampler call's first forward makes on its stream, block by block, in a comfy-aimdo malloc graph, and replays that
record on the forwards after it: a forward whose allocations differ from the record is a graph break (an error under
`--assert-graph-breaks`). A family that does something once, on a shape's first call (the attention family measures
its backends; cuDNN's FP8 SDPA builds its graph and workspace; FP8 codes kept between calls are quantised), does it
inside `outside_recorded_allocations()`: on a side stream, whose allocations the malloc graph does not record, so the
record holds only what every forward allocates alike. Not the release's own `pause_malloc_graph()`: its pause is one
flag, and the release pauses around work of its own (Qwen-Image 2.1's prefix pass runs each block paused on the
first forward), inside which a pause and resume of ours would resume the graph halfway (measured: one break per
block). On a release without the compiler, or with it off, the context does nothing.

The compiler captures a block in a CUDA graph on its second call, so a shape's first call is eager; a shape first
seen while a stream is capturing (`capturing`) is not measured there (timing syncs the host, which ends a capture):
it runs without the choice this once and is measured on its next eager call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading

import torch

PREFETCH_MODULE = "comfy.model_prefetch"
_SIDE_STREAMS: dict = {}
_LOCAL = threading.local()      # .main: the stream the compiler records while inside the context, else None


def recording() -> bool:
    """Whether the release's malloc graph is open on this thread (between its malloc_graph_begin and end)."""
    graphs = getattr(sys.modules.get(PREFETCH_MODULE), "MALLOC_GRAPHS", None)
    graph = graphs.get(threading.get_ident()) if isinstance(graphs, dict) else None
    return graph is not None and bool(getattr(graph, "_comfy_active", False))


@contextlib.contextmanager
def outside_recorded_allocations():
    """A context whose CUDA work runs on a side stream while the compiler records (nothing where it does not):
    the side stream waits for the recorded one before, and the recorded one for it after. Re-entrant."""
    if getattr(_LOCAL, "main", None) is not None or not recording() or not torch.cuda.is_available():
        yield
        return
    main = torch.cuda.current_stream()
    side = _SIDE_STREAMS.get(main.device)
    if side is None:
        side = _SIDE_STREAMS[main.device] = torch.cuda.Stream(device=main.device)
    side.wait_stream(main)
    _LOCAL.main = main
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        _LOCAL.main = None
        main.wait_stream(side)


def kept(value):
    """`value` (a tensor, a dataclass or tuple of them) made inside the context and kept for later calls: its
    tensors marked as used by the recorded stream, so their memory is not reused before that stream is done."""
    main = getattr(_LOCAL, "main", None)
    if main is not None:
        for tensor in _tensors(value):
            tensor.record_stream(main)
    return value


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name))


def capturing(tensor: torch.Tensor) -> bool:
    """Whether the current CUDA stream of `tensor`'s device is capturing a CUDA graph (False off CUDA)."""
    return tensor.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
