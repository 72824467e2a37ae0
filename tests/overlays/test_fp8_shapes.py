"""FP8 Linears by shape (issue 29.2): the row-wise quantiser that makes a per-call Linear two launches, and the
per-call rule that runs ComfyUI's bf16 Linear where the measured table says FP8 cannot win.

The rule's tests write their own table (never the shipped numbers); the shipped table is only checked for being
readable and for citing a results key that exists.
"""
from __future__ import annotations

import json
import logging

import pytest
import torch

import comfy_2026_ops as ops
from fused_dit import state
from fused_dit.integration import fp8_modules, fp8_shapes
from fused_dit.ops import fp8_linear as fl
from fused_dit.ops import quantize_fp8_rows as qr
from test_fp8 import interpreter_only
from test_pack_layering import RESULTS, resolve


# ------------------------------------------------------------------------------------------ the row-wise quantiser
@interpreter_only
@pytest.mark.parametrize("k", [48, qr.SINGLE_PASS_MAX_K + 16], ids=["one pass", "two passes"])
def test_one_launch_quantises_both_operands_row_by_row_as_the_reference(k, seed):
    generator = torch.Generator().manual_seed(seed)
    a = 4 * torch.randn(3, k, generator=generator).bfloat16()
    a[1] = 0                                                    # an all-zero row: the floor, zero codes
    w = torch.randn(5, k, generator=generator).bfloat16()
    values_a, scales_a, values_w, scales_w = qr.quantize_pair_triton(a, w, out_fp32=True)
    codes_a, ref_a = qr.quantize_rows_reference(a)
    codes_w, ref_w = qr.quantize_rows_reference(w)
    assert torch.equal(scales_a, ref_a) and scales_a.shape == (3, 1)
    assert torch.equal(scales_w, ref_w.reshape(1, -1)) and scales_w.shape == (1, 5)
    # the value the kernel casts, cast by torch (the interpreter's own fp8 cast deviates: test_fp8)
    assert torch.equal(values_a.to(torch.float8_e4m3fn).view(torch.uint8), codes_a.view(torch.uint8))
    assert torch.equal(values_w.to(torch.float8_e4m3fn).view(torch.uint8), codes_w.view(torch.uint8))


def test_the_weight_scales_start_aligned_after_the_activations():
    slots, offset = qr.scale_slots(17, 8)
    assert offset % qr.SCALE_ALIGN == 0 and offset >= 17 and slots == offset + 8


def test_a_per_call_weight_gives_the_codes_a_kept_row_wise_weight_gives(fp8_calls):
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    kept = fl.Fp8Weight(*fl.quantize_weight_fp8_rows(w), False, None, ())
    assert kept.rowwise and fl.per_call_weight(w).rowwise
    assert torch.equal(fl.linear_fp8(x, fl.per_call_weight(w), None), fl.linear_fp8(x, kept, None))


# ------------------------------------------------------------------------------------------ the rule
def _table(tmp_path, per_call, cached=None, measured=True):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({
        "measured": measured, "evidence": {"file": "generation-0.33.0.json", "key": "runs[config=stock]"},
        "min_rows": {"per_call": per_call, "cached": cached or [{"max_k": 1 << 20, "rows": 0}]}}))
    fp8_shapes.use_table(path)


def _lora_layer(n=32, k=64):
    # the legacy ModelPatcher's low-VRAM LoRA: the FP8 forward goes through ComfyUI's cast, the weight quantised
    # for each call (the per_call mechanism)
    layer = ops.to_comfy_ops(torch.nn.Sequential(torch.nn.Linear(k, n)).bfloat16())[0]
    layer.weight_function = [lambda w: w + 0.01]
    return layer


def test_a_per_call_linear_with_few_rows_runs_stock_and_one_with_many_runs_fp8(tmp_path, fp8_calls, caplog):
    _table(tmp_path, [{"max_k": 128, "rows": 64}, {"max_k": 4096, "rows": None}])
    layer = _lora_layer()
    state.forget_said()
    with caplog.at_level(logging.INFO, logger="fused_dit"), torch.inference_mode():
        few = torch.randn(2, 8, 64, dtype=torch.bfloat16)                   # 16 rows
        out_few = fp8_modules.fp8_linear_forward(layer, few, layer.forward)
        fp8_modules.fp8_linear_forward(layer, few[:1], layer.forward)        # 8 rows: the same reason
        assert not fp8_calls and torch.equal(out_few, layer(few))
        many = torch.randn(4, 32, 64, dtype=torch.bfloat16)                 # 128 rows
        fp8_modules.fp8_linear_forward(layer, many, layer.forward)
    assert fp8_calls == ["linear"]
    lines = [r.getMessage() for r in caplog.records if fp8_shapes.STOCK in r.getMessage()
             or "ComfyUI's bf16 Linear" in r.getMessage()]
    assert len(lines) == 1, lines                                            # said once per reason
    assert "weight quantised for each call" in lines[0] and "see benchmarks/results/generation-0.33.0.json" in lines[0]


def test_a_band_where_fp8_never_won_declines_every_call(tmp_path, fp8_calls):
    _table(tmp_path, [{"max_k": 32, "rows": 0}, {"max_k": 4096, "rows": None}])
    layer = _lora_layer()
    with torch.inference_mode():
        fp8_modules.fp8_linear_forward(layer, torch.randn(512, 64, dtype=torch.bfloat16), layer.forward)
    assert not fp8_calls
    assert fp8_shapes.rows_needed(fp8_shapes.PER_CALL, 16) == (0, 32)
    assert fp8_shapes.rows_needed(fp8_shapes.PER_CALL, 1 << 16) == (None, 4096)   # above every band: the last


def test_codes_kept_beside_the_bf16_weight_decline_by_the_cached_table(tmp_path, fp8_calls):
    _table(tmp_path, [{"max_k": 1 << 20, "rows": 0}], cached=[{"max_k": 1 << 20, "rows": 100}])
    layer = torch.nn.Linear(64, 32).bfloat16()
    with torch.inference_mode():
        small = torch.randn(10, 64, dtype=torch.bfloat16)
        assert torch.equal(fp8_modules.fp8_linear_forward(layer, small, layer.forward), layer(small))
        fp8_modules.fp8_linear_forward(layer, torch.randn(200, 64, dtype=torch.bfloat16), layer.forward)
    assert fp8_calls == ["linear"]


def test_an_unreadable_table_declines_nothing(tmp_path, fp8_calls):
    fp8_shapes.use_table(tmp_path / "missing.json")
    layer = _lora_layer()
    with torch.inference_mode():
        fp8_modules.fp8_linear_forward(layer, torch.randn(2, 64, dtype=torch.bfloat16), layer.forward)
    assert fp8_calls == ["linear"]


def test_the_shipped_table_is_readable_and_cites_a_results_key_that_exists():
    fp8_shapes.use_table(None)
    table = fp8_shapes.table()
    assert table is not None and set(table["bands"]) == set(fp8_shapes.MECHANISMS)
    if RESULTS.is_dir():
        resolve(json.loads((RESULTS / table["evidence"].file).read_text(encoding="utf-8")), table["evidence"].key)
