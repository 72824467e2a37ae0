"""Probe for torch/sm89-limits: the peak TFLOPS torch.cuda._device_limits.GPULimits computes for Ada GPUs.

Runs in the target's interpreter (see verify/README.md); needs no GPU. GPULimits reads everything from
`torch.cuda.get_device_properties(device)` (SM count, `clock_rate` in kHz, major/minor, name), so the probe
substitutes the properties of an RTX 4090 and an L40S for the duration of each call and compares with the
published peaks: RTX 4090 fp16 tensor 165.2, fp8 660.6, fp32 CUDA cores 82.6 TFLOPS; L40S fp16 tensor 362.
Stock torch has no sm_89 rows (every call raises "No data for sm_89").
"""
import inspect
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, run  # noqa: E402 - importable only after the line above

TOLERANCE = 0.02   # the L40S sheet figure (362) uses a clock slightly below the 2520 MHz boost GPULimits sees

# Boost clocks and SM counts from NVIDIA's specifications; clock_rate is in kHz as cudaDeviceProp reports it.
DEVICES = {
    "RTX 4090": SimpleNamespace(name="NVIDIA GeForce RTX 4090", major=8, minor=9, multi_processor_count=128,
                                clock_rate=2_520_000, memory_clock_rate=10_501_000, memory_bus_width=384,
                                total_memory=24 * 2**30),
    "L40S": SimpleNamespace(name="NVIDIA L40S", major=8, minor=9, multi_processor_count=142,
                            clock_rate=2_520_000, memory_clock_rate=9_001_000, memory_bus_width=384,
                            total_memory=48 * 2**30),
}
# (device, dtype name, use_tensor_cores) -> published peak TFLOPS (dense)
EXPECTED = {
    ("RTX 4090", "float16", True): 165.2,
    ("RTX 4090", "bfloat16", True): 165.2,
    ("RTX 4090", "float8_e4m3fn", True): 660.6,
    ("RTX 4090", "float32", False): 82.6,
    ("L40S", "float16", True): 362.0,
}


def peak_tflops(torch, limits_module, props, dtype, use_tensor_cores):
    """GPULimits' answer for a device with the given properties, or the error it raises."""
    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda device=None: props
    try:
        limits = limits_module.GPULimits(torch.device("cuda", 0))
        return limits.get_tflops_per_second(dtype, use_tensor_cores=use_tensor_cores)
    finally:
        torch.cuda.get_device_properties = real


def main(args):
    import torch

    expect_applied = (args.get("expect") or {}).get("applied")
    numbers = {"torch": torch.__version__}
    try:
        import torch.cuda._device_limits as limits_module
    except ImportError:
        return emit("SKIP", f"torch {torch.__version__} has no torch.cuda._device_limits (added in 2.10)", numbers)
    numbers["module_file"] = inspect.getsourcefile(limits_module)

    measured, errors = {}, {}
    for (device_name, dtype_name, tensor_cores), _ in EXPECTED.items():
        key = f"{device_name} {dtype_name} {'tensor' if tensor_cores else 'cuda-cores'}"
        try:
            measured[key] = round(peak_tflops(torch, limits_module, DEVICES[device_name],
                                              getattr(torch, dtype_name), tensor_cores), 1)
        except RuntimeError as exc:
            errors[key] = str(exc)
    numbers["tflops"] = measured
    numbers["errors"] = errors

    if expect_applied is None:
        return emit("WARN", f"no expectation given; sm_89 answers for {len(measured)} of {len(EXPECTED)} cases",
                    numbers)
    if not expect_applied:
        if measured:
            return emit("FAIL", f"stock GPULimits should have no sm_89 data, yet answered {measured}", numbers)
        return emit("PASS", "stock GPULimits has no sm_89 data (every case raises)", numbers)
    if errors:
        return emit("FAIL", f"GPULimits has no answer for {', '.join(errors)}", numbers)
    wrong = []
    for (device_name, dtype_name, tensor_cores), published in EXPECTED.items():
        key = f"{device_name} {dtype_name} {'tensor' if tensor_cores else 'cuda-cores'}"
        if abs(measured[key] - published) > TOLERANCE * published:
            wrong.append(f"{key}: {measured[key]} vs {published}")
    numbers["published"] = {f"{d} {t} {'tensor' if c else 'cuda-cores'}": v for (d, t, c), v in EXPECTED.items()}
    if wrong:
        return emit("FAIL", f"GPULimits is more than {TOLERANCE:.0%} off: {'; '.join(wrong)}", numbers)
    return emit("PASS", f"GPULimits matches the published sm_89 peaks within {TOLERANCE:.0%} "
                        f"(RTX 4090 fp16 tensor {measured['RTX 4090 float16 tensor']}, "
                        f"L40S {measured['L40S float16 tensor']} TFLOPS)", numbers)


if __name__ == "__main__":
    run(main)
