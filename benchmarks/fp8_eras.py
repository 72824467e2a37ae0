"""The FP8 seam's reach into ComfyUI's weight system, checked against real trees of several eras.

For each tree (a folder of ComfyUI's code, never committed), in a child process on the CPU with the FP8 GEMM
emulated from the same codes (fused_dit.testing.fp8_emulated), through the tree's own comfy.ops and comfy-kitchen:
1. the cast seam fused_dit.integration.fp8_weights finds for the tree's Linear ops (cast_bias_weight's arguments,
   uncast_bias_weight, the QuantizedTensor class);
2. a LoRA as the legacy ModelPatcher's low-VRAM mode attaches it (`weight_function` on a `manual_cast.Linear`): the
   FP8 forward runs through the tree's cast and its output moves by the LoRA's effect;
3. where the tree has mixed-precision ops (0.8 on), an fp8 layer loaded by the tree's own `_load_from_state_dict`
   from a `.comfy_quant` state dict: the FP8 forward gives torch._scaled_mm that layer's own codes and scale (no
   re-quantisation; output equal to the emulated GEMM of those codes) and is compared with ComfyUI's own forward;
   with a LoRA weight function on it, the cast dequantises and the FP8 path quantises that call's weight;
4. whether the tree has ModelPatcherDynamic (DynamicVRAM) and `is_dynamic`, which the node's replace path reads;
5. whether each Linear op class's forward is one the FP8 seam was verified on (variants.json), as the node decides.
DynamicVRAM's streaming itself needs comfy-aimdo and a CUDA device (on a CPU ComfyUI's cast takes its CPU branch):
the JSON says so; the generation command's overlay_fp8 / overlay_all_fp8 configs measure it on the GPU.
Modules the trees import that this machine lacks and that have nothing to do with the ops are stubbed (as in
eras.py) and listed.

    python -m benchmarks validate fp8-eras --tree 0.3.64=DIR --tree 0.33.0=DIR ... [--out FILE]
        [--record-mixed]      # each tree's mixed_precision_ops().Linear, where its checks passed, becomes a verified
                              # era of the FP8 Linear seam (variants.json: VERSION:mixed_precision_ops().Linear)
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from . import results
from .eras import _install_stubs, child_json
from .eras import import_paths  # noqa: F401  (the tree, overlays/ and the deps: the entry point asks this module)

REPO = Path(__file__).resolve().parents[1]


def _error(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def runtime_child(tree: Path) -> dict:
    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")
    stubbed: list[str] = []
    _install_stubs(stubbed)
    sys.argv = ["main.py", "--cpu"]
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfyui_version
    import torch
    import comfy.model_patcher
    import comfy.ops
    from fused_dit.integration import eras, fp8_modules, fp8_weights
    from fused_dit.ops import fp8_linear as fl
    from fused_dit.testing import fp8_emulated

    result: dict = {"comfyui_version": comfyui_version.__version__, "stubbed_unrelated_modules": stubbed}
    generator = torch.Generator().manual_seed(0)
    seam = fp8_weights.cast_seam_of(comfy.ops.manual_cast.Linear)
    result["cast_seam"] = None if seam is None else {
        "offloadable": seam.offloadable, "compute_dtype_and_want_requant": seam.requant,
        "uncast_bias_weight": seam.uncast is not None,
        "quantized_tensor": None if seam.quantized_type is None else
        f"{seam.quantized_type.__module__}.{seam.quantized_type.__name__}"}
    torch.manual_seed(0)
    with torch.inference_mode():
        base = torch.nn.Linear(64, 48).bfloat16()
        layer = comfy.ops.manual_cast.Linear(64, 48, dtype=torch.bfloat16)
        layer.load_state_dict(base.state_dict())
        x = torch.randn(4, 64, generator=generator).bfloat16()
        delta = 0.1 * torch.randn(48, 64, generator=generator)
        layer.weight_function = [lambda w: w + delta.to(w.dtype)]
        with fp8_emulated([]) as calls:
            lora_fp8 = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
        lora_stock, plain = layer(x), base(x)
        result["lora_weight_function"] = {
            "fp8_gemms": len(calls), "rel_error_vs_stock_with_lora": round(_error(lora_fp8, lora_stock), 4),
            "rel_error_vs_stock_without_lora": round(_error(lora_fp8, plain), 4),
            "lora_kept": _error(lora_fp8, lora_stock) < _error(lora_fp8, plain)}
        result["mixed_precision"] = _mixed_precision(torch, comfy.ops, fp8_modules, fl, fp8_emulated, base, x)
    mp = comfy.model_patcher
    result["dynamic_vram"] = {
        "ModelPatcherDynamic": hasattr(mp, "ModelPatcherDynamic"),
        "ModelPatcher.is_dynamic": hasattr(mp.ModelPatcher, "is_dynamic"),
        "streaming_checked_here": False,
        "why": "DynamicVRAM streams through comfy-aimdo on a CUDA device; on a CPU ComfyUI's cast takes its CPU branch "
               "(the generation command's overlay_fp8 / overlay_all_fp8 count the FP8 GEMMs there)"}
    classes = {"disable_weight_init.Linear": comfy.ops.disable_weight_init.Linear,
               "manual_cast.Linear": comfy.ops.manual_cast.Linear}
    if hasattr(comfy.ops, "mixed_precision_ops"):
        classes["mixed_precision_ops().Linear"] = comfy.ops.mixed_precision_ops({}, torch.bfloat16).Linear
    result["linear_seam_verified"] = {}
    result["linear_forward_fingerprints"] = {}
    for name, cls in classes.items():
        verdict = eras._verdict(eras.LINEAR_VARIANT, {eras.LINEAR_FORWARD: cls.forward})
        result["linear_seam_verified"][name] = verdict.verified_on or f"not verified: {verdict.reason}"
        result["linear_forward_fingerprints"][name] = eras.fingerprint_of(cls.forward)[0]
    return result


MIXED = "mixed_precision_ops().Linear"


def mixed_checks_passed(tree: dict) -> str | None:
    """None when a tree's run shows the FP8 seam correct on its mixed-precision Linear (its own codes and scale to
    the GEMM, none re-quantised, a LoRA weight function kept), else why not."""
    row = tree.get("mixed_precision") or {}
    if not tree.get("ran") or not row.get("present"):
        return "no mixed-precision ops in this tree (or the run failed)"
    lora = row.get("lora_weight_function") or {}
    checks = {"an FP8 GEMM ran": row.get("fp8_gemms", 0) >= 1, "no weight re-quantised": row.get(
        "weights_requantised") == 0, "the GEMM got its own codes and scale": row.get(
        "equals_gemm_of_its_codes_and_scale") is True, "a LoRA weight function was kept": lora.get(
        "fp8_gemms", 0) >= 1 and lora.get("rel_error_vs_with_lora", 1) < lora.get("rel_error_vs_without_lora", 0)}
    failed = [name for name, ok in checks.items() if not ok]
    return f"failed: {', '.join(failed)}" if failed else None


def record_mixed(trees: dict, variants_json: Path) -> list[str]:
    """Accept each tree's mixed-precision Linear forward as a verified era of the FP8 Linear seam (label
    'VERSION:mixed_precision_ops().Linear'), where that tree's checks passed; returns the labels written."""
    data = json.loads(variants_json.read_text())
    spec = data["variants"]["linear_fp8_seam"]
    (dependency,) = spec["depends_on"]
    written = []
    for version, tree in trees.items():
        fingerprint = (tree.get("linear_forward_fingerprints") or {}).get(MIXED)
        if fingerprint and mixed_checks_passed(tree) is None:
            label = f"{version}:{MIXED}"
            spec["verified_on"][label] = {dependency: fingerprint}
            written.append(label)
    variants_json.write_text(json.dumps(data, indent=2) + "\n")
    return written


def _mixed_precision(torch, ops, fp8_modules, fl, fp8_emulated, base, x) -> dict:
    if not hasattr(ops, "mixed_precision_ops"):
        return {"present": False}
    layer = ops.mixed_precision_ops({}, torch.bfloat16).Linear(64, 48)
    scale = base.weight.detach().float().abs().amax() / 448.0
    codes = (base.weight.detach().float() / scale).to(torch.float8_e4m3fn)
    state = {"weight": codes, "weight_scale": scale.reshape(()), "bias": base.bias.detach(),
             "comfy_quant": torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)}
    layer.load_state_dict(state, strict=False)
    weight = layer._parameters["weight"]
    quantised = []
    real = fl.quantize_weight_fp8
    fl.quantize_weight_fp8 = lambda w: quantised.append(w) or real(w)
    try:
        with fp8_emulated([]) as calls:
            out = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
    finally:
        fl.quantize_weight_fp8 = real
    row = {"present": True, "weight_type": type(weight).__name__, "layout": getattr(weight, "_layout_cls", None),
           "fp8_gemms": len(calls), "weights_requantised": len(quantised)}
    if hasattr(weight, "_qdata"):
        expected = fl.linear_fp8(x, fl.Fp8Weight(weight._qdata, weight._params.scale.float(), False, None, ()),
                                 layer.bias)
        row["equals_gemm_of_its_codes_and_scale"] = bool(torch.equal(out, expected))
    row["rel_error_vs_bf16_linear"] = round(_error(out, base(x)), 4)
    # a LoRA as a weight function on the quantized layer: the cast dequantises, the FP8 path quantises per call
    delta = 0.1 * torch.randn(48, 64, generator=torch.Generator().manual_seed(2))
    layer.weight_function = [lambda w: w + delta.to(w.dtype)]
    with fp8_emulated([]) as lora_calls:
        lora_out = fp8_modules.fp8_linear_forward(layer, x, layer.forward)
    with_lora = torch.nn.functional.linear(x.float(), weight.dequantize().float() + delta, layer.bias.float())
    row["lora_weight_function"] = {"fp8_gemms": len(lora_calls),
                                   "rel_error_vs_with_lora": round(_error(lora_out, with_lora), 4),
                                   "rel_error_vs_without_lora": round(_error(lora_out, out), 4)}
    layer.weight_function = []
    try:
        row["rel_error_vs_comfyui_own_forward"] = round(_error(out, layer(x)), 4)
    except Exception as exc:         # ComfyUI's own fp8 path may need a GPU backend
        row["comfyui_own_forward"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return row


def add_arguments(parser) -> None:
    parser.add_argument("--tree", action="append", default=[], help="VERSION=DIR")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fp8-eras.json")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--record-mixed", action="store_true",
                        help="accept each tree's mixed_precision_ops().Linear forward as a verified era of the FP8 "
                             "Linear seam in overlays/fused_dit/variants.json, where its checks passed")
    parser.add_argument("--runtime-child", type=Path, help=argparse.SUPPRESS)


def run(args, parser=None) -> int:
    if args.runtime_child:
        print(json.dumps(runtime_child(args.runtime_child), default=str))
        return 0
    import torch
    trees = {}
    for spec in args.tree:
        version, _, folder = spec.partition("=")
        trees[version] = child_json("fp8-eras", Path(folder), args.timeout)
    report = {"benchmark": "fp8-eras", "script": "benchmarks/fp8_eras.py",
              "about": __doc__.split("\n\n")[1].replace("\n", " "),
              "environment": {"gpu": "none (CPU, FP8 GEMM emulated)", "torch": torch.__version__,
                              "python": platform.python_version(),
                              "date": results.now(),
                              # the trees' folders are this machine's: the command names them by release only
                              "command": " ".join(["python -m benchmarks validate fp8-eras",
                                                   *(f"--tree {v}=TREE-{v}" for v in trees)])},
              "trees": trees}
    args.out.write_text(results.dumps(report) + "\n")
    print(json.dumps(trees, indent=1, default=str))
    if args.record_mixed:
        labels = record_mixed(trees, REPO / "overlays" / "fused_dit" / "variants.json")
        print(f"recorded {', '.join(labels) or 'nothing'}")
    return 0 if all(t.get("ran") for t in trees.values()) else 1

