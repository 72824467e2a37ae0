"""benchmarks/fp8_linear_shapes.py on the CPU: the table it derives from a measurement, and the pack reads it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import fp8_linear_shapes as bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "overlays"))


def _case(m, k, n, stock, per_call, cached):
    return {"m": m, "k": k, "n": n, "bf16": {"wall_us": stock}, "fp8_per_call_rowwise": {"wall_us": per_call},
            "fp8_cached": {"wall_us": cached}, "fp8_cached_rowwise": {"error": "RuntimeError: not measured"}}


CASES = [
    _case(64, 3072, 3072, 10, 30, 20), _case(1024, 3072, 3072, 50, 60, 40), _case(4096, 3072, 3072, 100, 90, 60),
    _case(64, 3072, 9216, 10, 30, 8), _case(1024, 3072, 9216, 50, 40, 40), _case(4096, 3072, 9216, 100, 80, 60),
    _case(64, 5120, 5120, 10, 30, 20), _case(4096, 5120, 5120, 100, 120, 90),
]


def test_the_table_takes_the_fewest_rows_from_which_fp8_won_at_every_larger_count_and_every_n():
    table = bench.derive_table(CASES)
    assert table["per_call"] == [{"max_k": 3072, "rows": 4096}, {"max_k": 5120, "rows": None}]
    assert table["cached"] == [{"max_k": 3072, "rows": 1024}, {"max_k": 5120, "rows": 4096}]


def test_the_written_table_is_what_the_pack_reads(tmp_path):
    from fused_dit.integration import fp8_shapes
    source = tmp_path / "fp8-linear-shapes-h200.json"
    source.write_text(json.dumps({"environment": {"gpu": "test"}, "cases": CASES}))
    path = bench.write_table(json.loads(source.read_text()), source, tmp_path / "table.json")
    assert json.loads(path.read_text())["evidence"] == {"file": source.name, "key": "table"}
    fp8_shapes.use_table(path)
    try:
        assert fp8_shapes.rows_needed("per_call", 3072) == (4096, 3072)
        assert fp8_shapes.rows_needed("cached", 4000) == (4096, 5120)
        assert fp8_shapes.decline_reason("per_call", 8192, 3072) is None
        assert "fp8-linear-shapes-h200.json: table" in fp8_shapes.decline_reason("per_call", 64, 3072)
    finally:
        fp8_shapes.use_table(None)
