"""cuDNN's FP8 SDPA path (ops/attention_cudnn_fp8.py): what runs without a GPU, its refusals and its quantisers.
The GPU half (graphs built and run, error against fp32 attention) is measured by `python -m benchmarks
attention-kernels` on the H200.

The options (rotation of q and k, V's mean) are checked through what cuDNN computes from its operands, emulated in
fp64 (exact softmax of the dequantised q and k, times the dequantised v, plus V's mean): the algebra (a common
rotation keeps Q K^T, P (V - m) + m = P V) and that each option lowers the error on inputs it is for.
"""
import pytest
import torch

from fused_dit.ops import attention_cudnn_fp8 as op
from fused_dit.ops import rotate_quantize_fp8 as rq
from fused_dit.testing import byte_mismatch


def _qkv(shape=(1, 2, 16, 64), dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(3)]


def test_a_missing_frontend_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(op, "cudnn", None)
    monkeypatch.setattr(op, "IMPORT_ERROR", "ModuleNotFoundError: No module named 'cudnn'")
    assert "not importable" in op.refusal(*_qkv())


@pytest.mark.parametrize("change, words", [
    (lambda q, k, v: dict(mask=torch.zeros(1)), "mask"),
    (lambda q, k, v: {}, "CUDA"),
])
def test_refusals_name_their_cause(monkeypatch, change, words):
    monkeypatch.setattr(op, "cudnn", object())      # the frontend present: the other checks speak
    q, k, v = _qkv()
    assert words in op.refusal(q, k, v, **change(q, k, v))


def test_per_tensor_codes_round_to_e4m3_with_scale_amax_over_448():
    x = _qkv()[0]
    codes, scale = op.per_tensor_codes(x)
    assert codes.dtype == torch.float8_e4m3fn and codes.is_contiguous() and scale.shape == (1, 1, 1, 1)
    assert torch.equal(scale.flatten(), (x.abs().amax().float() / 448).flatten())
    back = codes.float() * scale.flatten()
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 for normal codes, plus the bf16 step before it
    assert float(((back - x.float()).abs() - x.float().abs() * 2 ** -4).max()) <= float(scale) * 2 ** -6
    assert codes.float().abs().max() == 448


def dit_like(seed: int, d: int = 128, s: int = 256):
    """q and k with a few channels ten times larger (k also offset per channel), v offset per channel: bf16."""
    g = torch.Generator().manual_seed(seed)
    gain = torch.ones(d)
    gain[torch.randperm(d, generator=g)[:4]] = 10.0
    q = (torch.randn(1, 2, s, d, generator=g) * gain).bfloat16()
    k = (torch.randn(1, 2, s, d, generator=g) * gain + torch.randn(d, generator=g)).bfloat16()
    v = (torch.randn(1, 2, s, d, generator=g) + 4 * torch.randn(d, generator=g)).bfloat16()
    return q, k, v


def emulated(codes: rq.RotatedCodes, dtype=torch.bfloat16) -> torch.Tensor:
    """What cuDNN's graph computes from the operands (P unquantised), in fp64, then V's mean added back."""
    q, k, v = (getattr(codes, n).double() * getattr(codes, f"{n}_scale").double() for n in "qkv")
    p = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return op.add_value_mean((p @ v).to(dtype), codes.v_mean)


def relative_error(out, q, k, v) -> float:
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v.double()
    return float((out.double() - exact).norm() / exact.norm())


def test_the_value_mean_comes_back_exactly_for_convex_rows():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 3, 7, 11, generator=g, dtype=torch.float64) * 3, dim=-1)
    v = torch.randn(2, 3, 11, 8, generator=g, dtype=torch.float64) + 5
    m = v.mean(dim=2, keepdim=True)
    assert torch.allclose(p @ (v - m) + m, p @ v, rtol=0, atol=1e-12)
    out, mean = torch.randn(2, 3, 7, 8, generator=g).bfloat16(), torch.randn(2, 3, 1, 8, generator=g)
    assert torch.equal(op.add_value_mean(out.clone(), mean), (out.float() + mean).bfloat16())  # one rounding
    assert op.add_value_mean(out, None) is out


def test_plain_options_keep_the_eager_quantisation():
    q, k, v = _qkv()
    codes = op.operands(q, k, v, op.PLAIN)
    expected = [op.per_tensor_codes(x) for x in (q, k - k.mean(dim=-2, keepdim=True), v)]
    for got, got_scale, (want, want_scale) in zip(codes[:3], codes[3:6], expected):
        assert byte_mismatch(got, want)[0] == 0 and torch.equal(got_scale, want_scale)
    assert codes.v_mean is None


@pytest.mark.parametrize("options", [op.ROTATED, op.Fp8Options(rotate=True, v_mean=True),
                                     op.Fp8Options(v_mean=True), op.Fp8Options(rotate=True, fused=False)])
def test_options_take_the_rotating_quantiser(options):
    q, k, v = dit_like(0, 64, 16)
    codes = op.operands(q, k, v, options)
    ref = rq.rotate_quantize_reference(q, k, v, options.rotate, options.v_mean)   # off an FP8 GPU: the same
    assert all(byte_mismatch(a, b)[0] == 0 for a, b in zip(codes[:3], ref[:3]))
    assert all(torch.equal(a, b) for a, b in zip(codes[3:6], ref[3:6]))
    assert (codes.v_mean is None) != options.v_mean


@pytest.mark.parametrize("seed", [0, 1])
def test_each_option_lowers_the_error_on_the_inputs_it_is_for(seed):
    """Outlier channels: the rotation's error is below the plain codes'; V offset per channel: V's mean lowers the
    rotated error further. (The algebra is exact: what differs is the rounding.)"""
    q, k, v = dit_like(seed)
    plain, rotated, both = (relative_error(emulated(op.operands(q, k, v, options)), q, k, v) for options in
                            (op.PLAIN, op.ROTATED, op.Fp8Options(rotate=True, v_mean=True)))
    assert rotated < plain and both < rotated
