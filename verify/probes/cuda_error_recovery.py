"""Probe for torch/cuda-error-recovery: what torch.cuda._utils._check_cuda raises for CUDA driver errors.

Runs in the target's interpreter (see verify/README.md); needs no GPU. `_check_cuda(result)` asks the driver
library for the error's text (`cuGetErrorString`, through `_get_gpu_runtime_library()` from torch 2.10 and
`_get_cuda_library()` before); the probe swaps that getter for a stand-in that knows the driver's messages, then
calls `_check_cuda` with 2 (out of memory), 700 (illegal address), 999 (unknown) and 1 (invalid value).
Patched: 2 raises torch.OutOfMemoryError with the driver's message, 700 and 999 a RuntimeError that says to
restart, 1 the stock RuntimeError. Stock: a plain RuntimeError("CUDA error: <message>") for all. With CUDA the
probe initialises it first, so the patched out-of-memory branch really runs synchronize() and empty_cache().
"""
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, run  # noqa: E402 - importable only after the line above

DRIVER_MESSAGES = {
    1: b"invalid argument",
    2: b"out of memory",
    700: b"an illegal memory access was encountered",
    999: b"unknown error",
}


class FakeDriverLibrary:
    """Answers cuGetErrorString like libcuda does: writes a C string into the pointer passed by reference."""

    def cuGetErrorString(self, result, pointer_ref):
        pointer_ref._obj.value = DRIVER_MESSAGES.get(int(result), b"unrecognized error code")
        return 0


def raised_by(check, code):
    try:
        check(code)
    except Exception as exc:  # noqa: BLE001 - the type is what is being measured
        return exc
    return None


def main(args):
    import torch

    expect_applied = (args.get("expect") or {}).get("applied")
    device = args.get("device", "auto")
    numbers = {"torch": torch.__version__}
    import torch.cuda._utils as cuda_utils
    if not hasattr(cuda_utils, "_check_cuda"):
        return emit("SKIP", f"torch {torch.__version__} has no torch.cuda._utils._check_cuda (added in 2.8)",
                    numbers)
    numbers["module_file"] = inspect.getsourcefile(cuda_utils)
    getters = [g for g in ("_get_gpu_runtime_library", "_get_cuda_library") if hasattr(cuda_utils, g)]
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.init()
        numbers["device_name"] = torch.cuda.get_device_name()
    out_of_memory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

    saved = {g: getattr(cuda_utils, g) for g in getters}
    try:
        for getter in getters:
            setattr(cuda_utils, getter, lambda: FakeDriverLibrary())
        raised = {code: raised_by(cuda_utils._check_cuda, code) for code in sorted(DRIVER_MESSAGES)}
        raised_for_success = raised_by(cuda_utils._check_cuda, 0)
    finally:
        for getter, function in saved.items():
            setattr(cuda_utils, getter, function)
    numbers["raised"] = {str(code): None if exc is None else f"{type(exc).__name__}: {exc}"
                         for code, exc in raised.items()}

    if raised_for_success is not None:
        return emit("FAIL", f"_check_cuda(0) raised {raised_for_success!r}", numbers)
    if any(exc is None for exc in raised.values()):
        return emit("FAIL", "_check_cuda returned without raising for a driver error", numbers)
    message = {code: str(exc) for code, exc in raised.items()}
    oom = raised[2]
    patched_shape = {
        "out of memory is torch.OutOfMemoryError": isinstance(oom, out_of_memory),
        "out of memory keeps the driver's message": DRIVER_MESSAGES[2].decode() in message[2],
        "700 says restart": not isinstance(raised[700], out_of_memory) and "restart" in message[700],
        "999 says restart": not isinstance(raised[999], out_of_memory) and "restart" in message[999],
        "other errors unchanged": type(raised[1]) is RuntimeError and message[1] == "CUDA error: invalid argument",
    }
    stock_shape = {
        f"{code} is a plain RuntimeError": type(raised[code]) is RuntimeError
        and message[code] == f"CUDA error: {DRIVER_MESSAGES[code].decode()}"
        for code in DRIVER_MESSAGES
    }
    numbers["patched_checks"] = patched_shape
    numbers["stock_checks"] = stock_shape
    if expect_applied is None:
        return emit("WARN", f"no expectation given; out of memory raises {type(oom).__name__}", numbers)
    checks = patched_shape if expect_applied else stock_shape
    failed = [name for name, ok in checks.items() if not ok]
    state = "patched" if expect_applied else "stock"
    if failed:
        return emit("FAIL", f"_check_cuda does not behave as {state}: {'; '.join(failed)}", numbers)
    return emit("PASS", f"_check_cuda behaves as {state}: out of memory raises {type(oom).__name__}, "
                        f"700 raises {type(raised[700]).__name__}", numbers)


if __name__ == "__main__":
    run(main)
