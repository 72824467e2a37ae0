"""Fused AdaLN `addcmul(shift, LayerNorm(x), 1 + scale)` against both references, modulation layouts included."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fused_dit.dispatch import choose
from fused_dit.ops import adaln, modulation_group, repeat_rows_like_comfy
from fused_dit.testing import assert_close_fp32, generator, poisoned_empty


def modulation(B, rows, C, gen, dtype=torch.float32):
    """shift and scale as ComfyUI gets them: strided chunks of one `[B, rows, 6, C]` tensor."""
    e = (torch.randn(B, rows, 6, C, generator=gen) * 0.5).to(dtype)
    return e[:, :, 0], e[:, :, 1]


@pytest.mark.parametrize("B,L,C,rows", [
    (2, 37, 68, 1),      # per sample, C not a multiple of the 512 channels per step
    (2, 37, 64, 37),     # per token
    (2, 40, 48, 4),      # Wan grouped rows, even split
    (2, 37, 48, 5),      # Wan grouped rows, uneven split (repeat_e repeats tokens // rows + 1)
    (1, 16, 96, 1),
])
def test_adaln_matches_comfy_chain_and_fp64_and_writes_every_element(B, L, C, rows, seed):
    gen = generator(seed)
    x = torch.randn(B, L, C, generator=gen) * 2 + 0.3
    shift, scale = modulation(B, rows, C, gen)
    out = adaln.adaln(x, shift, scale, out=poisoned_empty((B, L, C), x.dtype))
    assert_close_fp32(out, adaln.reference_comfy(x, shift, scale), "vs ComfyUI chain")
    assert_close_fp32(out, adaln.reference_fp32(x, shift, scale), "vs fp64")


def test_two_dimensional_modulation_is_per_sample(seed):
    gen = generator(seed)
    x = torch.randn(3, 9, 32, generator=gen)
    shift, scale = torch.randn(3, 32, generator=gen), torch.randn(3, 32, generator=gen)
    assert_close_fp32(adaln.adaln(x, shift, scale), adaln.reference_fp32(x, shift, scale))


def test_each_sample_gets_its_own_modulation_row_at_batch_above_one(seed):
    """Batch mapping by modulo instead of division is wrong only at batch > 1 (CFG): pin it down."""
    gen = generator(seed)
    x = torch.randn(1, 8, 32, generator=gen).expand(2, 8, 32).contiguous()
    shift, scale = modulation(2, 4, 32, gen)
    out = adaln.adaln(x, shift, scale)
    assert_close_fp32(out[1], adaln.reference_fp32(x[1:], shift[1:], scale[1:])[0])
    assert (out[0] - out[1]).abs().max() > 1e-3


@pytest.mark.parametrize("rows,tokens", [(1, 7), (4, 40), (5, 37), (21, 4097), (7, 7), (9, 4), (3, 100)])
def test_modulation_group_reproduces_repeat_e(rows, tokens):
    expanded = repeat_rows_like_comfy(torch.arange(rows).view(1, rows, 1), tokens).flatten()
    group = modulation_group(rows, tokens)
    expected = expanded if expanded.numel() == tokens else expanded.expand(tokens)
    assert torch.equal(torch.arange(tokens) // group if rows > 1 else torch.zeros(tokens, dtype=torch.long), expected)


def test_rows_that_repeat_e_cannot_broadcast_are_rejected(seed):
    gen = generator(seed)
    x = torch.randn(1, 5, 16, generator=gen)
    shift, scale = modulation(1, 3, 16, gen)
    with pytest.raises((ValueError, RuntimeError)):
        adaln.adaln(x, shift, scale)


def test_forced_eager_backend_runs_the_comfy_chain_exactly(monkeypatch, seed):
    monkeypatch.setenv("FUSED_DIT_BACKEND", "eager")
    gen = generator(seed)
    x = torch.randn(2, 9, 64, generator=gen).bfloat16()
    shift, scale = modulation(2, 1, 64, gen, torch.bfloat16)
    assert choose("adaln", x).backend == "eager"
    assert torch.equal(adaln.adaln(x, shift, scale), adaln.reference_comfy(x, shift, scale))
    out = poisoned_empty(x.shape, x.dtype)
    assert adaln.adaln(x, shift, scale, out=out) is out and torch.equal(out, adaln.reference_comfy(x, shift, scale))


def test_output_dtype_follows_eager_type_promotion(seed):
    gen = generator(seed)
    x = torch.randn(1, 4, 32, generator=gen, dtype=torch.float64).float()
    shift, scale = modulation(1, 1, 32, gen, torch.float16)
    assert adaln.adaln(x, shift, scale).dtype == adaln.reference_comfy(x, shift, scale).dtype == torch.float32


@pytest.mark.parametrize("L,rows,per_program,shared", [
    (8, 1, 2, True),     # Flux: one row per sample, the group is every token
    (40, 4, 2, True),    # Wan groups of 10 tokens
    (40, 4, 4, False),   # groups of 10 split across programs of 4 rows
    (37, 1, 2, False),   # a sample's last program would run into the next sample
    (48, 6, 4, True),    # groups of 8
])
def test_rows_of_a_program_share_one_modulation_row_only_where_they_all_have_it(L, rows, per_program, shared,
                                                                                seed, device):
    """The shared-modulation path loads the first row's shift/scale for the whole program: at batch > 1 and
    grouped rows it must give the per-row path's bits, and be taken only where every row has that modulation."""
    B, C = 3, 64
    assert adaln.shared_modulation(L, [modulation_group(rows, L)] * 2, per_program) is shared
    launch = replace(adaln.LAUNCH, rows_per_program=per_program)
    gen = generator(seed)
    x = (torch.randn(B, L, C, generator=gen) * 2 + 0.3).to(device)
    shift, scale = (m.to(device) for m in modulation(B, rows, C, gen))
    out = adaln.adaln(x, shift, scale, out=poisoned_empty((B, L, C), x.dtype).to(device), launch=launch)
    assert torch.equal(out, adaln.adaln(x, shift, scale, launch=replace(launch, shared_modulation=False)))
    assert_close_fp32(out.cpu(), adaln.reference_comfy(x.cpu(), shift.cpu(), scale.cpu()), "vs ComfyUI chain")


PLAIN_LOOPS = {"prefetch": False, "stats_unroll": 1, "loop_unroll": 1, "loop_stages": None, "held_max_steps": 0,
               "mod_ahead": 0}


@pytest.mark.parametrize("C", [1024, 1540])
@pytest.mark.parametrize("schedule", [{}, {"prefetch": True}, {"loop_unroll": 2}, {"stats_unroll": 3},
                                      {"loop_stages": 2}, {"prefetch": True, "stats_unroll": 2, "loop_unroll": 2},
                                      {"held_max_steps": 4}, {"held_max_steps": 4, "mod_ahead": 1},
                                      {"held_max_steps": 4, "mod_ahead": 3}])
@pytest.mark.parametrize("mod_rows", [1, 6])    # per sample (rows of a program share it) and per token
def test_loop_schedules_keep_the_bits(C, schedule, mod_rows, seed, device):
    """Prefetching the next chunk, unrolling, pipelining, holding the row in registers (C=1024: two held steps;
    C=1540 is not a multiple of 512 and is read twice) and loading held steps' modulation ahead (past the last
    step too) change when loads are issued, never the values: the shipped schedule ({}) and each variant equal the
    plain loops bit for bit, tail chunks (C % 512) included."""
    gen = generator(seed)
    x = (torch.randn(2, 6, C, generator=gen) * 2 + 0.3).to(device)
    shift, scale = (m.to(device) for m in modulation(2, mod_rows, C, gen))
    scheduled = adaln.adaln(x, shift, scale, out=poisoned_empty(x.shape, x.dtype).to(device)) if not schedule \
        else None
    plain_loops = replace(adaln.LAUNCH, **PLAIN_LOOPS)
    plain = adaln.adaln(x, shift, scale, launch=plain_loops)
    if schedule:
        scheduled = adaln.adaln(x, shift, scale, out=poisoned_empty(x.shape, x.dtype).to(device),
                                launch=replace(plain_loops, **schedule))
    assert torch.equal(scheduled, plain)


def test_without_the_reciprocal_table_adaln_runs_eager_and_says_why(monkeypatch, caplog, seed, device):
    """While a CUDA graph is being captured the table cannot be made (count_reciprocals gives None): the call runs
    ComfyUI's eager chain, which a capture records as it is, and the log says why."""
    import logging
    gen = generator(seed)
    x = (torch.randn(2, 4, 64, generator=gen)).to(device)
    shift, scale = (m.to(device) for m in modulation(2, 1, 64, gen))
    monkeypatch.setattr(adaln.norm_order, "count_reciprocals", lambda n, device: None)
    with caplog.at_level(logging.INFO, logger="fused_dit"):
        out = adaln.adaln(x, shift, scale)
    assert torch.equal(out, adaln.reference_comfy(x, shift, scale))
    assert "CUDA graph capture" in caplog.text


def test_adaln_inside_a_cuda_graph_capture_replays_eagers_bits(device, seed):
    """A real capture on a GPU, with no table made before it: the captured call falls back to eager (no host copy
    inside the capture), and replaying the graph gives the eager chain's output; after it the kernel runs."""
    if device != "cuda":
        pytest.skip("needs a CUDA device to capture a graph")
    from fused_dit.ops import norm_order
    C = 1536
    norm_order._reciprocals.pop((norm_order.steps(C) * norm_order.TORCH_VEC, torch.device("cuda", 0)), None)
    gen = generator(seed)
    x = torch.randn(2, 8, C, generator=gen).to(device, torch.bfloat16)
    shift, scale = (m.to(device, torch.bfloat16) for m in modulation(2, 1, C, gen))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = adaln.adaln(x, shift, scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, adaln.reference_comfy(x, shift, scale))
    assert torch.equal(adaln.adaln(x, shift, scale), captured)     # the kernel outside the capture: eager's bits
