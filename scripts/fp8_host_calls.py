"""Host work of the FP8 linears per call and per step, on a CPU: aten ops, Triton launches and microseconds.

    .venv/bin/python scripts/fp8_host_calls.py --label before|after [--overlays DIR] [--commit TEXT]
                                               [--out benchmarks/results/fp8-host-calls.json]

Runs the real FP8 path with the GPU work stubbed (tests/overlays/fp8_host_harness.py: Triton launches counted,
torch._scaled_mm replaced by its output allocation), on the project's Flux-shaped fixture with Flux-dev's count of
blocks (19 double, 38 single: 228 FP8 Linears) at tiny shapes, so what is timed is host work alone:
- per Linear call, the overlay enabled once: a plain Linear (enable's seam), an FFN (two Linears, GELU fused into
  the second's quantisation) and the node's Fp8CodesLinear (fp8_weights=replace): aten ops and launches per call
  (deterministic) and host microseconds (median of rounds; this machine's, named in the file);
- per step through the node's APPLY_MODEL wrapper (fp8_linear only, fp8_weights=replace, the ModelPatcher fake of
  tests/overlays/test_fp8_codes.py): FP8 plans built per step, aten ops per step, the
  node's enable+disable pair alone; host milliseconds per step inside the FP8 forwards.
Each --label replaces its own record in --out, so a "before" run of the old code and an "after" run of the new sit
side by side. Timings are this CPU's; the counts hold on any machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

ROUNDS = 9
DOUBLE, SINGLE = 19, 38          # Flux-dev's blocks


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    import os
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "note": "a shared build machine (other jobs ran beside this one): microseconds are indicative, counts "
                    "exact"}


def median_us(fn, calls: int) -> float:
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return round(statistics.median(rounds), 2)


def per_call(calls) -> dict:
    import blocks
    import fused_dit
    from fp8_host_harness import count_torch_ops
    from fused_dit.integration.fp8_codes import Fp8CodesLinear

    model, _ = blocks.make_flux_stack(hidden=64, depth=1, depth_single=1, dtype=torch.bfloat16, comfy_state="newer")
    single = model.single_blocks[0]
    codes = Fp8CodesLinear.from_linear(single.linear1, single.linear1.weight, torch.device("cpu"),
                                       torch.device("cpu"))
    single.linear1 = codes                                  # as the node's object patch leaves it
    fused_dit.enable(model, ops=("fp8_linear",))
    cases = {"linear_bf16_weight": (single.linear2, single.linear2.in_features),
             "ffn_two_linears": (model.double_blocks[0].img_mlp, 64),
             "fp8_codes_linear_replace": (codes, codes.in_features)}
    out = {}
    try:
        with torch.inference_mode():
            for name, (module, k) in cases.items():
                x = torch.randn(2, 32, k, dtype=torch.bfloat16)
                module(x)
                before = sum(calls.launches.values())
                ops = count_torch_ops(module, x)
                launches = sum(calls.launches.values()) - before
                out[name] = {"aten_ops_per_call": sum(ops.values()), "aten_ops": dict(sorted(ops.items())),
                             "launches_per_call": launches, "host_us_per_call": median_us(lambda: module(x), 400)}
    finally:
        fused_dit.disable(model)
    return out


def per_step(calls) -> dict:
    import blocks
    import comfyui_fused_dit as node_pack
    import fused_dit
    from fp8_host_harness import count_torch_ops
    from fused_dit.integration import fp8_modules
    from test_fp8_codes import LifecyclePatcher

    model, inputs = blocks.make_flux_stack(hidden=64, depth=DOUBLE, depth_single=SINGLE, dtype=torch.bfloat16,
                                           comfy_state="newer")
    base = LifecyclePatcher(model)
    (patched,) = node_pack.FusedDiTOps().patch(base, norm_rope=False, adaln=False, gate=False, fp8_linear=True)
    built = [0]
    real_plan = fp8_modules.Fp8Plan

    def counting_plan(*args, **kwargs):
        built[0] += 1
        return real_plan(*args, **kwargs)

    patched.sample(inputs)                                   # loads the clone: the codes take the Linears' place
    fp8_modules.Fp8Plan = counting_plan
    try:
        before_plans, before_launches = built[0], sum(calls.launches.values())
        ops = count_torch_ops(patched.sample, inputs)
        plans, launches = built[0] - before_plans, sum(calls.launches.values()) - before_launches
    finally:
        fp8_modules.Fp8Plan = real_plan
    fp8_ms = fp8_forward_ms_per_step(lambda: patched.sample(inputs))
    walk_ms = median_us(lambda: (fused_dit.enable(model, ops=("fp8_linear",)), fused_dit.disable(model)), 1) / 1e3
    return {"fp8_linears": len(patched.object_patches), "fp8_plans_built_per_step": plans,
            "aten_ops_per_step": sum(ops.values()), "launches_per_step": launches,
            "fp8_forwards_host_ms_per_step": fp8_ms, "node_enable_disable_ms_per_step": round(walk_ms, 2)}


def fp8_forward_ms_per_step(step) -> float:
    """Median over rounds of the time one step spends inside the FP8 module forwards (the rest of a step on a CPU
    is the fixture's own bf16 math, not host work a GPU run pays)."""
    from fused_dit import integration
    spent = [0.0]
    real = integration.fp8_linear_forward, integration.ffn_forward_fp8

    def timed(function):
        def run(*args):
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                spent[0] += time.perf_counter() - start
        return run

    integration.fp8_linear_forward, integration.ffn_forward_fp8 = (timed(f) for f in real)
    rounds = []
    try:
        for _ in range(ROUNDS):
            spent[0] = 0.0
            step()
            rounds.append(spent[0] * 1e3)
    finally:
        integration.fp8_linear_forward, integration.ffn_forward_fp8 = real
    return round(statistics.median(rounds), 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fp8-host-calls.json")
    parser.add_argument("--commit", default="", help="the commit measured (recorded as given)")
    parser.add_argument("--overlays", type=Path, default=REPO / "overlays",
                        help="the overlays folder to measure (e.g. a copy of an older commit's)")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(args.overlays), str(REPO / "tests" / "overlays"), str(REPO / "benchmarks")]
    import fused_dit  # noqa: F401  (from --overlays, before conftest puts the repository's overlays on the path)
    import conftest  # noqa: F401  (accepts the fixture blocks' fingerprints as a verified era, as the tests do)
    from fp8_host_harness import host_only_fp8

    with host_only_fp8() as calls:
        record = {"commit": args.commit, "per_call": per_call(calls), "per_step_through_the_node": per_step(calls)}
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update({"benchmark": "fp8-host-calls", "script": "scripts/fp8_host_calls.py",
                   "about": __doc__.split("\n\n")[2].strip().replace("\n", " ")})
    import datetime
    from results_io import command_line
    result["environment"] = {"gpu": "none (CPU; the GPU work stubbed)", "python": platform.python_version(),
                             "torch": torch.__version__,
                             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "command": command_line()}
    result.setdefault("machines", {})[args.label] = machine()
    result.setdefault("runs", {})[args.label] = record
    from results_io import dumps
    args.out.write_text(dumps(result) + "\n")
    json.dump(record, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
