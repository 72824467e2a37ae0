"""The fused ops as torch custom ops, so that torch.compile sees one opaque call per op.

Each op module registers its op here (`register`): the real implementation is the op's own eager-mode entry point
(dispatch, launch, eager fallback), the fake one allocates outputs of the right shape and dtype and runs nothing.
The public op functions ask `compiling()` first: while Dynamo traces they return the custom op's call, so the
trace never enters the dispatch or launch Python (which reads the environment, caches and data pointers and
would break the graph); in eager mode they run their implementation directly, without the dispatcher's cost per
call. Both paths run the same code on the same tensors, so the results are the same bits.

The namespace is the package's top-level name (`torch.ops.fused_dit.<op>`), so a second copy of the package
imported under another name (benchmarks/fp8_host_overhead.py does this) registers its own ops.
"""
from __future__ import annotations

import torch

NAMESPACE = __name__.split(".")[0]


def compiling() -> bool:
    """True while torch.compile (Dynamo) traces the caller."""
    return torch.compiler.is_compiling()


def register(name: str, implementation, fake, mutates_args: tuple[str, ...] = ()):
    """`torch.ops.<NAMESPACE>.<name>`: a custom op running `implementation`, with `fake` as its meta function.

    The schema is inferred from `implementation`'s annotations (tensors, optional tensors, ints, floats, bools,
    strings; a tensor or a tuple of tensors, or None for an op that only mutates `mutates_args`).
    """
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", implementation, mutates_args=mutates_args)
    op.register_fake(fake)
    return op
