"""The RoPE op of the comfy-kitchen seam (ops/rope.py) against the eager chain it stands in for.

fp32 (on the CPU through TRITON_INTERPRET=1), compared bit for bit with ComfyUI's eager `_apply_rope1`
(which is also comfy-kitchen's eager backend) on Flux's `[B, H, L, D]` and Wan's `[B, L, H, D]` layouts, a batch
table, a table longer than x (trimmed as comfy-kitchen trims it) and a strided x.
"""
from __future__ import annotations

import pytest
import torch

import blocks
from fused_dit.ops import rope

CASES = {
    "flux": ((2, 4, 12, 16), (1, 1, 12)),
    "flux_longer_table": ((2, 4, 10, 16), (1, 1, 14)),
    "flux_batch_table": ((2, 4, 12, 16), (2, 1, 12)),
    "wan": ((2, 12, 4, 16), (1, 12, 1)),
}


def table(lead: tuple[int, int, int], head_dim: int, generator, device="cpu") -> torch.Tensor:
    positions = torch.arange(lead[0] * lead[1] * lead[2], dtype=torch.float32)
    positions = positions[torch.randperm(positions.numel(), generator=generator)]
    return blocks.rope_table(positions, head_dim).reshape(*lead, head_dim // 2, 2, 2).to(device)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernel_gives_the_eager_chains_bits(case, seed, device):
    generator = torch.Generator().manual_seed(seed)
    shape, lead = CASES[case]
    x = torch.randn(shape, generator=generator).to(device)
    freqs = table(lead, shape[-1], generator, device)
    assert rope.kernel_runs(x, freqs)
    out = rope.apply_rope1(x, freqs)
    assert out.is_contiguous() and out.dtype == x.dtype
    assert torch.equal(out, rope.reference_comfy(x, freqs))
    torch.testing.assert_close(out, rope.reference_fp64(x, freqs), rtol=1e-5, atol=1e-5)


def test_a_strided_x_reads_its_own_strides(seed, device):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 12, 3, 4, 16, generator=generator).to(device)[:, :, 1]
    freqs = table((1, 12, 1), 16, generator, device)
    assert torch.equal(rope.apply_rope1(x, freqs), rope.reference_comfy(x, freqs))


@pytest.mark.parametrize("make, why", [
    (lambda: (torch.randn(2, 3, 8), torch.zeros(1, 3, 4, 2, 2)), "is not a [A, B, C, D] tensor"),
    (lambda: (torch.randn(2, 3, 5, 8), torch.zeros(1, 1, 5, 4, 2, 2, dtype=torch.float64)), "is not fp32"),
    (lambda: (torch.randn(2, 3, 5, 8), torch.zeros(3, 1, 5, 4, 2, 2)), "does not broadcast"),
])
def test_layouts_the_kernel_does_not_take_run_the_fallback(make, why, caplog):
    x, freqs = make()
    calls = []
    out = rope.apply_rope1(x, freqs, fallback=lambda a, b: calls.append(1) or a)
    assert calls == [1] and out is x
