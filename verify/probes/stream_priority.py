"""Probe for torch/stream-priority: the default priority of torch.cuda.Stream (patched: -1, stock: 0).

Runs in the target's interpreter (see verify/README.md). Everywhere: reads the default of `priority` in the
signature of `torch.cuda.Stream.__new__`. With CUDA (device "auto" or "cuda"): creates a stream without a priority
argument and reads the priority CUDA gave it, which is the default clamped to `Stream.priority_range()`.
"""
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, inside, run  # noqa: E402 - importable only after the line above


def main(args):
    import torch

    expect_applied = (args.get("expect") or {}).get("applied")
    device = args.get("device", "auto")
    numbers = {"torch": torch.__version__}
    new = torch.cuda.Stream.__new__
    source_file = inspect.getsourcefile(new)
    numbers["module_file"] = source_file
    default = inspect.signature(new).parameters["priority"].default
    numbers["signature_default"] = default

    cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not cuda:
        return emit("FAIL", "device 'cuda' was requested but torch.cuda.is_available() is False", numbers)
    created = None
    if cuda:
        least, greatest = torch.cuda.Stream.priority_range()
        numbers["priority_range"] = [least, greatest]
        created = torch.cuda.Stream().priority
        numbers["created_stream_priority"] = created
        numbers["device_name"] = torch.cuda.get_device_name()

    if expect_applied is None:
        return emit("WARN", f"no expectation given; torch.cuda.Stream defaults to priority={default}", numbers)
    wanted = -1 if expect_applied else 0
    numbers["expected_default"] = wanted
    state = "patched" if expect_applied else "stock"
    if default != wanted:
        return emit("FAIL", f"torch.cuda.Stream defaults to priority={default}; the {state} value is {wanted}",
                    numbers)
    if cuda:
        # CUDA clamps a requested priority into [greatest, least] (greatest is the most negative).
        clamped = min(max(wanted, greatest), least)
        if created != clamped:
            return emit("FAIL", f"a stream created without priority got {created}, expected {clamped} "
                                f"(default {wanted} clamped to range {least}..{greatest})", numbers)
    site_packages = args.get("site_packages")
    where = "" if not site_packages or inside(source_file, site_packages) else \
        f" (but torch.cuda.streams was loaded from {source_file}, outside the target's site-packages)"
    tail = f"; a new stream got priority {created}" if cuda else "; no CUDA: stream creation not checked"
    outcome = "PASS" if not where else "WARN"
    return emit(outcome, f"torch.cuda.Stream defaults to priority={default} ({state}){tail}{where}", numbers)


if __name__ == "__main__":
    run(main)
