#!/usr/bin/env python3
"""Maintainer check: the node's fp8_weights="replace" through a real ComfyUI's ModelPatcher lifecycle.

Loads small Flux and Wan models (benchmarks/generation.py's --tiny shapes, seeded random weights) with ComfyUI's
own loader inside torch.inference_mode(), then samples with comfy.sample in the order a user's workflows would:

  stock -> node (replace) -> node (alongside) -> stock -> LoRA'd stock -> node on the LoRA'd model -> stock

and checks at each step what must hold (every check is recorded with its values):
  - replace and alongside give the same bits (same codes, same GEMM) and both ran FP8 GEMMs;
  - while the replace clone is loaded the tree holds Fp8CodesLinear modules, and (on a GPU) the allocated memory
    is lower than with the stock model by about one byte per replaced parameter;
  - every switch back to stock gives the first stock run's bits, with the original weights, bit for bit, on the
    load device;
  - a LoRA added to the MODEL before the node is baked into the codes (ComfyUI's convert_weight / set_weight):
    the node's output follows the LoRA'd stock output, not the plain one;
  - on a GPU, after ComfyUI partially unloads the replace clone (low VRAM), sampling still works.
On a machine without an sm_89+ GPU the FP8 GEMM is emulated from the same codes (as the CPU tests do) and the
JSON says so. Nothing from ComfyUI is copied into this repository.

    python scripts/validate_fp8_codes.py --comfyui DIR --out benchmarks/results/fp8-codes-comfyui.json
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))


EMULATED_CALLS: list[str] = []   # calls of the emulated FP8 path (fused_dit.testing.fp8_emulated)


class Checks:
    def __init__(self):
        self.items: list[dict] = []

    def add(self, name: str, ok: bool, **values):
        self.items.append({"check": name, "ok": bool(ok), **values})
        print(f"  {'ok  ' if ok else 'FAIL'} {name} {values if values else ''}", flush=True)


def validate_model(generation, session, spec, checks: Checks, device: str) -> dict:
    import torch
    import comfy.model_management as mm
    from comfyui_fused_dit import FusedDiTOps
    from fused_dit.integration.fp8_codes import Fp8CodesLinear

    resolution = spec.tiny_resolutions[0]
    run = generation.parse_run_spec("stock")
    base = session.load(spec, run)
    diffusion_model = base.model.diffusion_model
    latent, noise, positive = generation.inputs_for(spec, resolution, True, 0)
    originals = {k: v.detach().clone().cpu() for k, v in diffusion_model.state_dict().items()}

    def sample(model, label):
        with torch.inference_mode():
            calls = [0]
            real = torch._scaled_mm

            def counted(*a, **k):
                calls[0] += 1
                return real(*a, **k)
            torch._scaled_mm = counted
            emulated_before = len(EMULATED_CALLS)
            try:
                out = generation.sample(model, noise, latent, positive, 2, 0).float().cpu()
            finally:
                torch._scaled_mm = real
            calls[0] += len(EMULATED_CALLS) - emulated_before
        codes = sum(isinstance(m, Fp8CodesLinear) for m in diffusion_model.modules())
        allocated = torch.cuda.memory_allocated() if device == "cuda" else None
        return {"label": label, "out": out, "scaled_mm_calls": calls[0], "codes_modules": codes,
                "allocated": allocated}

    def weights_intact() -> tuple[bool, list[str]]:
        now = diffusion_model.state_dict()
        bad = [k for k, v in originals.items()
               if k not in now or now[k].device.type != torch.device(base.load_device).type
               or not torch.equal(now[k].detach().cpu(), v)]
        return not bad, bad[:5]

    node = FusedDiTOps()
    (replace,) = node.patch(base, fp8_linear=True, fp8_weights="replace")
    (alongside,) = node.patch(base, fp8_linear=True, fp8_weights="alongside")
    replaced = len(replace.object_patches)
    checks.add(f"{spec.key}: the replace clone carries one object patch per FP8 Linear", replaced > 0,
               object_patches=replaced)

    stock1 = sample(base, "stock")
    with_codes = sample(replace, "replace")
    codes_bytes = sum(m.weight.numel() for m in replace.object_patches.values())
    beside = sample(alongside, "alongside")
    stock2 = sample(base, "stock again")
    intact, bad = weights_intact()
    error = lambda a, b: float((a - b).norm() / b.norm().clamp_min(1e-30))  # noqa: E731
    fp8_error = error(with_codes["out"], stock1["out"])
    if with_codes["scaled_mm_calls"] and beside["scaled_mm_calls"]:
        checks.add(f"{spec.key}: replace and alongside ran FP8 GEMMs and give the same bits",
                   torch.equal(with_codes["out"], beside["out"]), replace=with_codes["scaled_mm_calls"],
                   alongside=beside["scaled_mm_calls"])
    else:   # ComfyUI computes in fp32 on a CPU, and the FP8 path declines fp32 activations
        checks.add(f"{spec.key}: FP8 declined ({stock1['out'].dtype} run): replace ran its dequantised weights, "
                   f"alongside the exact ones", torch.equal(beside["out"], stock1["out"]) and 0 < fp8_error < 0.1,
                   replace_error_vs_stock=fp8_error)
    checks.add(f"{spec.key}: the replace clone ran with Fp8CodesLinear modules in the tree",
               with_codes["codes_modules"] == replaced, codes_modules=with_codes["codes_modules"])
    if device == "cuda":
        saved = stock1["allocated"] - with_codes["allocated"]
        checks.add(f"{spec.key}: loaded with codes, the GPU holds about one byte less per replaced parameter",
                   saved >= 0.9 * codes_bytes, bytes_saved=saved, replaced_parameters=codes_bytes,
                   stock_allocated=stock1["allocated"], replace_allocated=with_codes["allocated"],
                   alongside_allocated=beside["allocated"])
    checks.add(f"{spec.key}: back to stock: the first stock bits", torch.equal(stock1["out"], stock2["out"]))
    checks.add(f"{spec.key}: back to stock: original weights, bit for bit, on the load device", intact, bad=bad)
    checks.add(f"{spec.key}: back to stock: no Fp8CodesLinear left in the tree", stock2["codes_modules"] == 0)

    # a LoRA-like weight patch (ComfyUI's "diff" form) on three of the replaced Linears, added before the node
    lora = base.clone()
    keys = [k + ".weight" for k in list(replace.object_patches)[:3]]
    generator = torch.Generator().manual_seed(1)
    patches = {k: (0.5 * torch.randn(originals[k[len("diffusion_model."):]].shape, generator=generator)
                   * originals[k[len("diffusion_model."):]].float().abs().mean(),) for k in keys}
    added = lora.add_patches(patches, 1.0)
    (lora_replace,) = node.patch(lora, fp8_linear=True, fp8_weights="replace")
    lora_stock = sample(lora, "stock + LoRA")
    lora_codes = sample(lora_replace, "replace on stock + LoRA")
    stock3 = sample(base, "stock after LoRA")
    follows, plain = error(lora_codes["out"], lora_stock["out"]), error(lora_codes["out"], stock1["out"])
    checks.add(f"{spec.key}: LoRA added before the node is baked into the codes",
               len(added) == len(keys) and follows < plain and follows <= 2 * fp8_error + 1e-6,
               error_vs_lora_stock=follows, error_vs_plain_stock=plain, fp8_error_without_lora=fp8_error)
    checks.add(f"{spec.key}: after the LoRA runs: the first stock bits", torch.equal(stock1["out"], stock3["out"]))
    intact, bad = weights_intact()
    checks.add(f"{spec.key}: after the LoRA runs: original weights, bit for bit", intact, bad=bad)

    if device == "cuda":   # low VRAM: ComfyUI moves part of the loaded clone back to host memory
        sample(replace, "replace (reload)")
        loaded = replace.loaded_size()
        freed = replace.partially_unload(replace.offload_device, memory_to_free=loaded // 2)
        partial = sample(replace, "replace after partially_unload")
        checks.add(f"{spec.key}: partially unloaded, the replace clone still samples close to its full-load bits",
                   freed > 0 and error(partial["out"], with_codes["out"]) < 0.05,
                   freed=freed, error=error(partial["out"], with_codes["out"]))
        mm.unload_all_models()
        stock4 = sample(base, "stock after low VRAM")
        checks.add(f"{spec.key}: after low VRAM: the first stock bits", torch.equal(stock1["out"], stock4["out"]))
    mm.unload_all_models()
    session.unload()
    return {"model": spec.key, "resolution": generation.resolution_name(resolution), "object_patches": replaced,
            "runs": [{k: v for k, v in r.items() if k != "out"} for r in
                     (stock1, with_codes, beside, stock2, lora_stock, lora_codes, stock3)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", type=Path, required=True, help="a ComfyUI checkout")
    parser.add_argument("--models", default="flux-dev,wan2.1-t2v-14b")
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    import generation
    device = "cuda" if Path("/dev/nvidia0").exists() else "cpu"
    comfyui = generation.import_comfyui(options.comfyui.resolve(), device, "comfy")
    import torch
    emulated = not (device == "cuda" and torch.cuda.get_device_capability() >= (8, 9))
    from fused_dit.testing import fp8_emulated
    session_options = argparse.Namespace(tiny=True, seed=0, save_checkpoint=False, work_dir=None,
                                         load_outside_inference_mode=False)
    session = generation.Session(session_options, device)
    checks = Checks()
    # without an sm_89+ GPU the FP8 GEMM is emulated from the same codes, as the CPU tests do
    with fp8_emulated(EMULATED_CALLS) if emulated else contextlib.nullcontext():
        models = [validate_model(generation, session, generation.MODELS[key], checks, device)
                  for key in options.models.split(",") if key]
    report = {"benchmark": "fp8-codes-comfyui", "script": "scripts/validate_fp8_codes.py",
              "environment": generation.environment(device, comfyui), "fp8_gemm": "emulated" if emulated else "real",
              "note": "Tiny models with seeded random weights: these are lifecycle checks, not speed or quality.",
              "passed": sum(c["ok"] for c in checks.items), "failed": sum(not c["ok"] for c in checks.items),
              "checks": checks.items, "models": models}
    generation.write_report(report, options.out)
    print(f"{report['passed']} passed, {report['failed']} failed; wrote {options.out}")
    return 0 if report["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
