"""Probe for torch/pinned-mapped: the flags torch.cuda._pin_memory_utils.pin_memory registers host memory with.

Runs in the target's interpreter (see verify/README.md). Everywhere: parses the flags argument of the
`cudaHostRegister` call in the function's source (patched: 3 = Portable | Mapped, stock: 1 = Portable). With CUDA:
registers a host buffer through that function, asks the CUDA runtime for the buffer's flags (`cudaHostGetFlags`,
loaded with ctypes: `torch.cuda.cudart()` does not bind it) and for its device pointer
(`cudaHostGetDevicePointer`), then unregisters it. On systems with unified addressing registered memory is
mapped either way, so only the static flags decide between stock and patched; the CUDA part must agree with a
patched install and is reported for a stock one.
"""
import ast
import ctypes
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, run  # noqa: E402 - importable only after the line above

HOST_REGISTER_PORTABLE = 1
HOST_REGISTER_MAPPED = 2


def registered_flags(function):
    """The constant third argument of the cudaHostRegister(...) call inside function, or None."""
    tree = ast.parse(inspect.getsource(function).lstrip())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "cudaHostRegister":
            if len(node.args) >= 3 and isinstance(node.args[2], ast.Constant):
                return node.args[2].value
    return None


def cuda_runtime_library(torch):
    """The CUDA runtime torch already loaded (dlopen by soname returns the loaded copy)."""
    major = (torch.version.cuda or "12").split(".")[0]
    names = ([f"cudart64_{major}.dll", f"cudart64_{major}0.dll"] if sys.platform == "win32"
             else [f"libcudart.so.{major}", "libcudart.so"])
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise OSError("; ".join(errors))


def check_on_device(torch, pin_memory, unpin_memory, numbers):
    """Register a buffer through the (possibly patched) function; return (mapped_bit_seen, device_pointer_ok)."""
    torch.cuda.init()
    cudart = cuda_runtime_library(torch)
    buffer = torch.empty(1 << 20, dtype=torch.uint8)   # an ordinary, unpinned host allocation
    pointer = buffer.data_ptr()
    pin_memory(pointer, buffer.numel())
    try:
        flags = ctypes.c_uint(0)
        status = cudart.cudaHostGetFlags(ctypes.byref(flags), ctypes.c_void_p(pointer))
        numbers["cudaHostGetFlags_status"] = status
        numbers["runtime_flags"] = flags.value if status == 0 else None
        device_pointer = ctypes.c_void_p(0)
        status = cudart.cudaHostGetDevicePointer(ctypes.byref(device_pointer), ctypes.c_void_p(pointer), 0)
        numbers["cudaHostGetDevicePointer_status"] = status
        numbers["device_pointer_obtained"] = status == 0 and bool(device_pointer.value)
    finally:
        unpin_memory(pointer)
    mapped = None if numbers["runtime_flags"] is None else bool(numbers["runtime_flags"] & HOST_REGISTER_MAPPED)
    return mapped, numbers["device_pointer_obtained"]


def main(args):
    import torch

    expect_applied = (args.get("expect") or {}).get("applied")
    device = args.get("device", "auto")
    numbers = {"torch": torch.__version__}
    try:
        import torch.cuda._pin_memory_utils as pin_utils
    except ImportError:
        return emit("SKIP", f"torch {torch.__version__} has no torch.cuda._pin_memory_utils (added in 2.8)",
                    numbers)
    numbers["module_file"] = inspect.getsourcefile(pin_utils)
    flags = registered_flags(pin_utils.pin_memory)
    numbers["source_flags"] = flags
    if not isinstance(flags, int):
        return emit("FAIL", "cannot find a constant flags argument of cudaHostRegister in pin_memory()", numbers)
    mapped_in_source = bool(flags & HOST_REGISTER_MAPPED)

    cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not cuda:
        return emit("FAIL", "device 'cuda' was requested but torch.cuda.is_available() is False", numbers)
    runtime_mapped = device_pointer_ok = None
    if cuda:
        numbers["device_name"] = torch.cuda.get_device_name()
        runtime_mapped, device_pointer_ok = check_on_device(torch, pin_utils.pin_memory, pin_utils.unpin_memory,
                                                            numbers)
    tail = ("; no CUDA: registration not exercised" if not cuda else
            f"; CUDA reports mapped={runtime_mapped}, device pointer obtained={device_pointer_ok}")

    if expect_applied is None:
        return emit("WARN", f"no expectation given; pin_memory registers with flags {flags}{tail}", numbers)
    wanted = HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED if expect_applied else HOST_REGISTER_PORTABLE
    numbers["expected_flags"] = wanted
    state = "patched" if expect_applied else "stock"
    if flags != wanted:
        return emit("FAIL", f"pin_memory registers with flags {flags}; the {state} value is {wanted}", numbers)
    if cuda and expect_applied and runtime_mapped is False:
        return emit("FAIL", f"source says flags {flags}, but cudaHostGetFlags reports "
                            f"{numbers['runtime_flags']} without the mapped bit", numbers)
    if cuda and expect_applied and not device_pointer_ok:
        return emit("FAIL", "the registered buffer has no device pointer (cudaHostGetDevicePointer status "
                            f"{numbers['cudaHostGetDevicePointer_status']})", numbers)
    if cuda and expect_applied and runtime_mapped is None:
        return emit("WARN", f"pin_memory registers with flags {flags} (mapped in source: {mapped_in_source}); "
                            f"cudaHostGetFlags failed with status {numbers['cudaHostGetFlags_status']}{tail}",
                    numbers)
    return emit("PASS", f"pin_memory registers with flags {flags} ({state}){tail}", numbers)


if __name__ == "__main__":
    run(main)
