"""scripts/validate_fp8_eras.py's --record-mixed: which trees' mixed-precision Linear becomes a verified era of the
FP8 Linear seam (the child's checks themselves run against real trees; here, the decision on their results)."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("validate_fp8_eras_under_test",
                                                  REPO / "scripts" / "validate_fp8_eras.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(**mixed):
    row = {"present": True, "fp8_gemms": 1, "weights_requantised": 0, "equals_gemm_of_its_codes_and_scale": True,
           "lora_weight_function": {"fp8_gemms": 1, "rel_error_vs_with_lora": 0.04, "rel_error_vs_without_lora": 1.3}}
    row.update(mixed)
    return {"ran": True, "mixed_precision": row,
            "linear_forward_fingerprints": {"mixed_precision_ops().Linear": "ab" * 32}}


def test_only_trees_whose_checks_passed_are_recorded(tmp_path):
    script = _script()
    variants = tmp_path / "variants.json"
    shutil.copy(REPO / "overlays" / "fused_dit" / "variants.json", variants)
    trees = {"9.1.0": _tree(), "9.2.0": _tree(weights_requantised=1),
             "9.3.0": _tree(equals_gemm_of_its_codes_and_scale=False), "9.4.0": {"ran": False},
             "9.5.0": _tree(lora_weight_function={"fp8_gemms": 1, "rel_error_vs_with_lora": 1.3,
                                                  "rel_error_vs_without_lora": 0.04})}
    assert script.mixed_checks_passed(trees["9.2.0"]) == "failed: no weight re-quantised"
    assert script.record_mixed(trees, variants) == ["9.1.0:mixed_precision_ops().Linear"]
    seam = json.loads(variants.read_text())["variants"]["linear_fp8_seam"]
    (dependency,) = seam["depends_on"]
    assert seam["verified_on"]["9.1.0:mixed_precision_ops().Linear"] == {dependency: "ab" * 32}
    assert not any(label.startswith(("9.2", "9.3", "9.4", "9.5")) for label in seam["verified_on"])


def test_the_shipped_mixed_precision_eras_are_the_ones_fp8_eras_json_verified():
    seam = json.loads((REPO / "overlays" / "fused_dit" / "variants.json").read_text())["variants"]["linear_fp8_seam"]
    trees = json.loads((REPO / "benchmarks" / "results" / "fp8-eras.json").read_text())["trees"]
    script = _script()
    for label, prints in seam["verified_on"].items():
        version, _, kind = label.partition(":")
        if kind:
            assert script.mixed_checks_passed(trees[version]) is None
            assert list(prints.values()) == [trees[version]["linear_forward_fingerprints"][kind]]
