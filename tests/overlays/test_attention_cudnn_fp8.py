"""cuDNN's FP8 SDPA path (ops/attention_cudnn_fp8.py): what runs without a GPU, its refusals and its quantiser.
The GPU half (graphs built and run, error against fp32 attention) is measured by `python -m benchmarks
attention-kernels` on the H200."""
import pytest
import torch

from fused_dit.ops import attention_cudnn_fp8 as op


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
