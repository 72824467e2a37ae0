"""Which fused op families stay fused while torch.compile (Dynamo) traces the overlay forwards.

Every fused op is a torch custom op (library.py), so Dynamo sees one opaque call per op and never traces the
dispatch or launch Python. But an opaque call is also a wall for Inductor: it cannot fuse anything into or across
it. Inductor already fuses LayerNorm + modulation (adaln) and the gated residual (gate) with their neighbours
about as well as our kernels do, so keeping them opaque under compile costs more than it saves; its QK RMSNorm +
RoPE is ~2.2x slower than our kernel (FACTS.md), so that family stays. A family left to Inductor traces the stock
math of ComfyUI's block, which is what the eager overlay computes bit for bit, so only the speed changes.

The default is decided by the GPU measurement in benchmarks/results/generation-0.3.64.json: config overlay_compile runs
this default, overlay_compile_allops sets UNDER_COMPILE to all three families. FP8 linears are governed
separately (fp8_modules) and are not read here. In eager mode (not tracing) every enabled family runs its kernel.

`fused` reads UNDER_COMPILE through this module at call time, so a benchmark can set
`compiled.UNDER_COMPILE = frozenset(...)` between runs (resetting Dynamo between them: a traced graph keeps the
choice it was traced with).
"""
from __future__ import annotations

from ..library import compiling

FAMILIES = frozenset({"norm_rope", "adaln", "gate"})
DEFAULT_UNDER_COMPILE = frozenset({"norm_rope"})
UNDER_COMPILE: frozenset[str] = DEFAULT_UNDER_COMPILE


def fused(family: str, ops) -> bool:
    """Whether the block forward runs `family`'s fused op: enabled in `ops`, and either not tracing or kept
    fused under compile by UNDER_COMPILE."""
    if family not in FAMILIES:
        raise ValueError(f"unknown op family {family!r}; fused under compile can be one of {sorted(FAMILIES)}")
    return family in ops and (not compiling() or family in UNDER_COMPILE)
