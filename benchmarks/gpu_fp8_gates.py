"""GPU gates for the FP8 overlay ops (5-7); writes JSON (GPU, versions, date) under --out.

Gates: FP8 codes byte-exact against the eager references (dynamic per-tensor, ComfyUI unit scale with its
in-place clamp, ComfyUI static scale); the fused GELU quantisation's code mismatch fraction (reported, one code
apart expected where tanh rounds differently); FP8 GEMM relative Frobenius error vs bf16 <= 5%; the ComfyUI fp8
module path bit-identical to ComfyUI's eager fp8_linear computation.

    PYTHONPATH=overlays:. python benchmarks/gpu_fp8_gates.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import torch
import torch.nn.functional as F


def environment() -> dict:
    import triton
    return {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}


def mismatch(a: torch.Tensor, b: torch.Tensor) -> dict:
    differ = a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)
    return {"numel": a.numel(), "mismatching": int(differ.sum()), "fraction": float(differ.float().mean())}


def activations(shape, dtype, seed, outliers=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda") * 3
    if outliers:
        x.view(-1)[::997] *= 400
    return x.to(dtype)


def gates() -> dict:
    from fused_dit.ops import fp8_linear as fl
    from fused_dit.ops import gelu_quantize_fp8 as gq
    from fused_dit.ops import quantize_fp8 as qf

    results: dict = {"torch_fp8_cast_saturates": qf.torch_fp8_cast_saturates("cuda:0")}
    codes = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        name = str(dtype).replace("torch.", "")
        for shape in ((16384, 3072), (4096 + 512, 3072), (7, 1000)):
            x = activations(shape, dtype, 1, outliers=True)
            ours, scale = qf.quantize_dynamic_triton(x)
            ref, ref_scale = qf.quantize_fp8_dynamic_reference(x)
            entry = mismatch(ours, ref)
            entry["scale_equal"] = bool(scale.item() == ref_scale.item())
            codes[f"dynamic/{name}/{shape[0]}x{shape[1]}"] = entry
            mine, theirs = x.clone(), x.clone()
            entry = mismatch(qf.quantize_comfy_triton(mine), qf.quantize_fp8_comfy_reference(theirs))
            entry["in_place_clamp_equal"] = bool(torch.equal(mine, theirs))
            codes[f"comfy_unit/{name}/{shape[0]}x{shape[1]}"] = entry
            scale_input = torch.tensor(0.37, device="cuda")
            codes[f"comfy_static/{name}/{shape[0]}x{shape[1]}"] = mismatch(
                qf.quantize_comfy_triton(x, scale_input), qf.quantize_fp8_comfy_reference(x, scale_input))
    results["quantize_codes"] = codes
    results["quantize_codes_byte_exact"] = all(
        v["mismatching"] == 0 and v.get("scale_equal", True) and v.get("in_place_clamp_equal", True)
        for v in codes.values())

    gelu = {}
    for dtype in (torch.bfloat16, torch.float16):
        h = activations((16384, 12288 // 4), dtype, 2)
        ours, scale = gq.gelu_quantize_dynamic_triton(h)
        ref, ref_scale = gq.gelu_quantize_fp8_dynamic_reference(h)
        entry = mismatch(ours, ref)
        entry["scale_equal"] = bool(scale.item() == ref_scale.item())
        entry["max_code_distance"] = int((ours.view(torch.uint8).int() - ref.view(torch.uint8).int()).abs().max())
        gelu[f"dynamic/{str(dtype)[6:]}"] = entry
        gelu[f"comfy_unit/{str(dtype)[6:]}"] = mismatch(gq.gelu_quantize_comfy_triton(h),
                                                        gq.gelu_quantize_fp8_comfy_reference(h))
    results["gelu_quantize_codes"] = gelu

    m, k, n = 16384, 3072, 12288
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).bfloat16()
    b = (0.02 * torch.randn(n, generator=g, device="cuda")).bfloat16()
    ref = F.linear(x.float(), w.float(), b.float())
    bf16 = F.linear(x, w, b).float()
    w_codes, w_scale = fl.quantize_weight_fp8(w)
    weight = fl.Fp8Weight(w_codes, w_scale, static_input=False, input_scale=None, source_key=())
    fp8 = fl.linear_fp8(x, weight, b).float()
    results["gemm_relative_frobenius_error"] = {
        "shape_MKN": [m, k, n],
        "fp8_vs_bf16": float((fp8 - bf16).norm() / bf16.norm()),
        "fp8_vs_fp32": float((fp8 - ref).norm() / ref.norm()),
        "bf16_vs_fp32": float((bf16 - ref).norm() / ref.norm()),
    }
    results["gemm_error_gate_5pct"] = results["gemm_relative_frobenius_error"]["fp8_vs_bf16"] <= 0.05

    # ComfyUI fp8 module path vs ComfyUI's eager computation (unit input scale, in-place clamp, _scaled_mm)
    module = torch.nn.Linear(k, n, bias=True, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        module.weight.data = w_codes.clone()
        module.bias.data = b.clone()
    module.scale_weight, module.scale_input = w_scale.clone(), None
    xs = x * 40   # push some activations beyond 448
    mine, theirs = xs.clone(), xs.clone()
    ours = fl.linear_fp8(mine, fl.fp8_weight_of(module), fl.module_bias(module, mine))
    theirs_codes = torch.clamp(theirs, min=-448, max=448, out=theirs).to(torch.float8_e4m3fn).contiguous()
    eager = torch._scaled_mm(theirs_codes, module.weight.t(), out_dtype=torch.bfloat16, bias=module.bias,
                             scale_a=torch.ones((), device="cuda"), scale_b=module.scale_weight)
    results["comfy_fp8_module_bit_identical"] = bool(torch.equal(ours, eager) and torch.equal(mine, theirs))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    result = {"environment": environment(), **gates()}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_fp8_gates.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
