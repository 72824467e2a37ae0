"""Row statistics of LayerNorm and RMSNorm in the exact order torch's CUDA kernel computes them.

ComfyUI's eager chain normalises with `F.layer_norm` / `F.rms_norm`, which on CUDA run torch's
`vectorized_layer_norm_kernel` (aten/src/ATen/native/cuda/layer_norm_kernel.cu) whenever the row length is a
multiple of 4 and the buffers are aligned. One block of 128 threads (4 warps) handles a row: thread t reads the
4-element vectors t, t + 128, t + 256, ... and folds their elements in order into its own state (RMSNorm: a sum of
squares, `s + v * v`, which nvcc contracts to an fma; LayerNorm: Welford's online update with the reciprocal of the
count); each warp then folds lane l + 16, 8, 4, 2, 1 into lane l (shuffle down), and the warps fold pairwise in
shared memory (warp y + 2 into y, then 1 into 0). The statistic is the result divided by N (IEEE division), and
`rstd = rsqrt(stat + eps)`.

A fused kernel that sums in any other order gets a float32 statistic a few ulps away about one row in a few
thousand; the normalised value then rounds to the other bf16 neighbour for ~1e-6 of elements, and where the next
step cancels (RoPE's cos*a - sin*b, AdaLN's shift + ln*(1 + scale) near zero) that one ulp becomes thousands of
ulps of the result. Folding in torch's order gives the same float32 statistic bit for bit, so the fused kernels
round exactly where eager does. `benchmarks/norm_order_probe.py` checks the emulation and the kernels against
torch on a GPU.

Here: the Triton helpers the kernels call, and a plain-torch emulation of the same order (the reference the CPU
tests hold the interpreter to; its fma is computed in float64, which matches a hardware fma except in double
rounding cases of probability ~2**-29 per operation).
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except Exception:  # the emulation below needs no triton
    triton = None

TORCH_THREADS = 128      # threads per row in torch's vectorized kernel (num_threads() on CUDA)
TORCH_VEC = 4            # elements per vector load
WARP = 32
CHUNK = TORCH_THREADS * TORCH_VEC   # channels the block reads per step of its loop


# Why a fused kernel defers to eager for other row lengths (its log line).
OTHER_PATH = ("rows of {n} channels: torch normalises them with its two-kernel Welford path, whose order the "
              "kernel does not reproduce")


def follows_torch_order(n: int) -> bool:
    """Whether torch normalises rows of length n with the vectorized kernel whose order the helpers reproduce.

    Otherwise (n not a multiple of 4) torch uses RowwiseMomentsCUDAKernel + LayerNormForwardCUDAKernel, another
    order; the fused ops then run eager rather than round differently from it.
    """
    return n > 0 and n % TORCH_VEC == 0


def steps(n: int) -> int:
    """Iterations of a thread's loop over a row of n channels."""
    return -(-n // CHUNK)


_reciprocals: dict[tuple[int, torch.device], torch.Tensor] = {}


# Why a kernel that needs count_reciprocals runs eager instead (its log line).
RECIPROCALS_WHILE_CAPTURING = ("the reciprocal table for rows of {n} channels is made on the CPU and copied to the "
                               "GPU, which a CUDA graph capture does not allow; a call outside the capture makes it")


def count_reciprocals(n: int, device: torch.device) -> torch.Tensor | None:
    """float32 `1 / k` for k = 1..n on device: the Welford update's reciprocals of the count, as IEEE quotients
    (torch's `1.f / count`; divided on the CPU, copied once per (n, device) and kept).

    None when the table does not exist yet and the current CUDA stream is capturing a graph: the copy would end the
    capture (the caller runs eager, RECIPROCALS_WHILE_CAPTURING; the first call outside a capture makes the table).
    """
    key = (n, device)
    table = _reciprocals.get(key)
    if table is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counts = torch.arange(1, n + 1, dtype=torch.float32)
        table = _reciprocals[key] = torch.ones(n, dtype=torch.float32).div(counts).to(device)
    return table


@functools.lru_cache(maxsize=None)
def halves_are_exact(n: int) -> bool:
    """Whether every fold of torch's Welford tree over a row of n channels weighs both sides by exactly 0.5.

    True when n is a multiple of CHUNK (every thread then holds 4 * steps(n) elements, so the two states of each
    fold have equal counts m) and float32 `m * (1 / (2m))` rounds to 0.5 at every level; then the fold is
    `mean = 0.5 * (own + other)`, `m2 = fma(delta * delta * m, 0.5, own_m2 + other_m2)`: sums of pairs, which
    fold_welford_equal computes without moving values between threads' layouts.
    """
    if n <= 0 or n % CHUNK:
        return False
    count = torch.tensor(4.0 * steps(n), dtype=torch.float32)   # float32 arithmetic on the CPU, IEEE division
    for _ in range(7):      # 5 lane folds, then up to 2 warp folds
        if float(count * (1.0 / (count + count))) != 0.5:
            return False
        count = count + count
    return True


# ---------------------------------------------------------------------------------------------------------------
# Emulation in torch (any device): the reference order, readable
# ---------------------------------------------------------------------------------------------------------------

def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double() + c.double()).float()


def _per_thread(x: torch.Tensor) -> torch.Tensor:
    """`[R, N]` -> `[R, steps, 128, 4]` (zero padded): [:, i, t, e] is element e of thread t's i-th vector."""
    rows, n = x.shape
    padded = torch.zeros(rows, steps(n) * CHUNK, dtype=torch.float32, device=x.device)
    padded[:, :n] = x.float()
    return padded.view(rows, steps(n), TORCH_THREADS, TORCH_VEC)


def _fold_tree(values, combine):
    """Fold per-thread states `[R, 128]` (a tuple of tensors) the way the block does: lanes, then warps."""
    lanes = tuple(v.reshape(v.size(0), TORCH_THREADS // WARP, WARP) for v in values)
    while lanes[0].size(-1) > 1:
        half = lanes[0].size(-1) // 2
        lanes = combine(tuple(v[..., :half] for v in lanes), tuple(v[..., half:] for v in lanes))
    warps = tuple(v[..., 0] for v in lanes)
    while warps[0].size(-1) > 1:
        half = warps[0].size(-1) // 2
        warps = combine(tuple(v[..., :half] for v in warps), tuple(v[..., half:] for v in warps))
    return tuple(v[..., 0] for v in warps)


def rms_stat_emulated(x: torch.Tensor) -> torch.Tensor:
    """Mean of squares of each row of `[R, N]`, folded in torch's order; float32 `[R]`."""
    parts = _per_thread(x)
    acc = torch.zeros(parts.shape[0], TORCH_THREADS, dtype=torch.float32, device=x.device)
    for i in range(parts.size(1)):
        for e in range(TORCH_VEC):
            v = parts[:, i, :, e]
            acc = _fma(v, v, acc)   # zero padding adds exactly nothing
    (total,) = _fold_tree((acc,), lambda own, other: (own[0] + other[0],))
    return _ieee_div(total, x.size(1))


def _ieee_div(values: torch.Tensor, n: int) -> torch.Tensor:
    """values / n correctly rounded, as the kernel's `/ float(N)` (torch's CUDA `tensor / scalar` multiplies by
    the reciprocal instead, which differs in the last bit for some values)."""
    return values / torch.full_like(values, float(n))


def _combine_emulated(own, other):
    """torch's cuWelfordCombine(dataB=own, dataA=other), with nvcc's fma contractions."""
    b_mean, b_m2, b_n = own
    a_mean, a_m2, a_n = other
    delta = b_mean - a_mean
    n = a_n + b_n
    coef = 1.0 / n.clamp_min(1.0)
    na, nb = a_n * coef, b_n * coef
    mean = _fma(na, a_mean, nb * b_mean)
    m2 = _fma(delta * delta * a_n, nb, a_m2 + b_m2)
    empty = n == 0
    return (torch.where(empty, 0.0, mean), torch.where(empty, 0.0, m2), n)


def layer_norm_stats_emulated(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, biased variance) of each row of `[R, N]` by torch's Welford order; float32 `[R]` each."""
    rows, n = x.shape
    parts = _per_thread(x)
    mean = torch.zeros(rows, TORCH_THREADS, dtype=torch.float32, device=x.device)
    m2 = torch.zeros_like(mean)
    vectors = n // TORCH_VEC
    threads = torch.arange(TORCH_THREADS, device=x.device)
    for i in range(parts.size(1)):
        valid = (i * TORCH_THREADS + threads) < vectors
        for e in range(TORCH_VEC):
            v = parts[:, i, :, e]
            rcp = torch.tensor(1.0, dtype=torch.float32) / float(i * TORCH_VEC + e + 1)
            delta = v - mean
            new_mean = _fma(delta, rcp.to(x.device), mean)
            new_m2 = _fma(delta, v - new_mean, m2)
            mean = torch.where(valid, new_mean, mean)
            m2 = torch.where(valid, new_m2, m2)
    count = (TORCH_VEC * ((vectors - threads + TORCH_THREADS - 1) // TORCH_THREADS).clamp_min(0)).float()
    total_mean, total_m2, _ = _fold_tree((mean, m2, count.expand(rows, -1)), _combine_emulated)
    return total_mean, _ieee_div(total_m2, n)


# ---------------------------------------------------------------------------------------------------------------
# Triton helpers
# ---------------------------------------------------------------------------------------------------------------

if triton is not None:

    THREADS = tl.constexpr(TORCH_THREADS)   # the same numbers, usable inside kernels
    LANES_PER_WARP = tl.constexpr(WARP)

    @triton.jit
    def _halves(v, A: tl.constexpr, N: tl.constexpr):
        """`[A, N]` -> (`v[:, :N//2]`, `v[:, N//2:]`)."""
        return tl.split(tl.permute(tl.reshape(v, [A, 2, N // 2]), (0, 2, 1)))

    @triton.jit
    def elements_of_vectors(x, R: tl.constexpr, T: tl.constexpr):
        """A `[R, T * 4]` chunk -> its four `[R, T]` tensors: element e of each thread's vector."""
        even, odd = tl.split(tl.reshape(x, [R, T, 2, 2]))
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        return x0, x1, x2, x3

    @triton.jit
    def square_into(acc, x0, x1, x2, x3):
        """A thread's `s + v * v` over its vector's elements in order (nvcc contracts it to an fma)."""
        acc = tl.fma(x0, x0, acc)
        acc = tl.fma(x1, x1, acc)
        acc = tl.fma(x2, x2, acc)
        return tl.fma(x3, x3, acc)

    @triton.jit
    def fold_sum(acc, R: tl.constexpr, LANES: tl.constexpr, WARPS: tl.constexpr):
        """Per-thread sums `[R, WARPS * LANES]` -> `[R]`: lane l + 16, 8, .. into l, then warp pairs (torch order).

        LANES < 32 stands for a warp whose upper lanes hold zeros (adding zero is exact), WARPS < 4 likewise.
        """
        # the tree as sums over size-2 axes: one add each (commutative, so which operand is "own" does not matter)
        # and no layout shuffles, unlike splitting halves apart
        v = tl.reshape(acc, [R * WARPS, LANES])
        for i in tl.static_range(5):
            if (LANES >> i) > 1:
                v = tl.sum(tl.reshape(v, [R * WARPS, 2, (LANES >> i) // 2]), axis=1)
        v = tl.reshape(v, [R, WARPS])
        for i in tl.static_range(3):
            if (WARPS >> i) > 1:
                v = tl.sum(tl.reshape(v, [R, 2, (WARPS >> i) // 2]), axis=1)
        return tl.reshape(v, [R])

    @triton.jit
    def welford_push(mean, m2, v, rcp, valid):
        """torch's cuWelfordOnlineSum for one element (rcp = 1 / new count), kept where `valid`."""
        delta = v - mean
        new_mean = tl.fma(delta, rcp, mean)
        new_m2 = tl.fma(delta, v - new_mean, m2)
        return tl.where(valid, new_mean, mean), tl.where(valid, new_m2, m2)

    @triton.jit
    def _welford_combine(b_mean, b_m2, b_n, a_mean, a_m2, a_n):
        delta = b_mean - a_mean
        n = a_n + b_n
        coef = tl.math.div_rn(tl.full(n.shape, 1.0, tl.float32), tl.maximum(n, 1.0))
        na = a_n * coef
        nb = b_n * coef
        mean = tl.fma(na, a_mean, nb * b_mean)
        m2 = tl.fma(delta * delta * a_n, nb, a_m2 + b_m2)
        empty = n == 0.0
        return tl.where(empty, 0.0, mean), tl.where(empty, 0.0, m2), n

    @triton.jit
    def _fold_equal_pairs(mean, m2, count, A: tl.constexpr, N: tl.constexpr):
        """One fold of `[A, N]` states that all hold `count` elements: element j takes in element j + N/2.

        torch's combine with both weights exactly 0.5 (halves_are_exact): each result is a sum over a size-2 axis
        (own + other, own - other), like fold_sum, so no value changes layout. `0.5 * (own + other)` equals torch's
        `fma(0.5, other, 0.5 * own)` unless a partial mean is below 2**-125 in magnitude (then 0.5 * it rounds).
        """
        pairs = tl.reshape(mean, [A, 2, N // 2])
        own_minus_other = tl.where(tl.arange(0, 2) == 0, 1.0, -1.0)[None, :, None]
        delta = tl.sum(pairs * own_minus_other, axis=1)
        new_mean = tl.sum(pairs, axis=1) * 0.5
        new_m2 = tl.fma(delta * delta * count, 0.5, tl.sum(tl.reshape(m2, [A, 2, N // 2]), axis=1))
        return new_mean, new_m2

    @triton.jit
    def fold_welford_equal(mean, m2, count, R: tl.constexpr, T: tl.constexpr):
        """fold_welford for states `[R, T]` that all hold `count` elements, when halves_are_exact(row length)."""
        WARPS: tl.constexpr = T // 32
        mean = tl.reshape(mean, [R * WARPS, 32])
        m2 = tl.reshape(m2, [R * WARPS, 32])
        for i in tl.static_range(5):
            mean, m2 = _fold_equal_pairs(mean, m2, count, R * WARPS, 32 >> i)
            count = count * 2.0
        mean = tl.reshape(mean, [R, WARPS])
        m2 = tl.reshape(m2, [R, WARPS])
        for i in tl.static_range(3):
            if (WARPS >> i) > 1:
                mean, m2 = _fold_equal_pairs(mean, m2, count, R, WARPS >> i)
                count = count * 2.0
        return tl.reshape(mean, [R]), tl.reshape(m2, [R])

    @triton.jit
    def fold_welford(mean, m2, count, R: tl.constexpr, T: tl.constexpr):
        """Per-thread Welford states `[R, T]` -> (mean `[R]`, m2 `[R]`) in torch's lane-then-warp order."""
        WARPS: tl.constexpr = T // 32
        mean = tl.reshape(mean, [R * WARPS, 32])
        m2 = tl.reshape(m2, [R * WARPS, 32])
        count = tl.reshape(count, [R * WARPS, 32])
        for i in tl.static_range(5):
            b_mean, a_mean = _halves(mean, R * WARPS, 32 >> i)
            b_m2, a_m2 = _halves(m2, R * WARPS, 32 >> i)
            b_n, a_n = _halves(count, R * WARPS, 32 >> i)
            mean, m2, count = _welford_combine(b_mean, b_m2, b_n, a_mean, a_m2, a_n)
        mean = tl.reshape(mean, [R, WARPS])
        m2 = tl.reshape(m2, [R, WARPS])
        count = tl.reshape(count, [R, WARPS])
        for i in tl.static_range(3):
            if (WARPS >> i) > 1:
                b_mean, a_mean = _halves(mean, R, WARPS >> i)
                b_m2, a_m2 = _halves(m2, R, WARPS >> i)
                b_n, a_n = _halves(count, R, WARPS >> i)
                mean, m2, count = _welford_combine(b_mean, b_m2, b_n, a_mean, a_m2, a_n)
        return tl.reshape(mean, [R]), tl.reshape(m2, [R])
