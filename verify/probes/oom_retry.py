"""Probe for comfyui/oom-retry: does a node that runs out of memory get one retry, and only one?

Runs in the target's interpreter (see verify/README.md); needs no GPU. Checks that execution.py calls the helper the
patch creates (applier_oom_retry.py at the ComfyUI root), then drives that helper with a fake node that raises the
release's OOM error (comfy.model_management.OOM_EXCEPTION, i.e. torch.cuda.OutOfMemoryError; nothing is allocated):

    OOM once   -> the node runs twice, the second result is returned, the models were unloaded before the retry
    OOM twice  -> the node runs twice and the FIRST error is raised (ComfyUI's handler then reports it as usual)
    other error -> raised at once, no retry

For a real ComfyUI checkout, comfy.model_management is imported as main.py would (`--cpu`), so the helper unloads
through the release's own functions; their calls are counted.

With a GPU (device "cuda", or "auto" when one answers) a real out-of-memory is provoked too: "model weights" fill
most of the free memory, a node asks for more than is left, the CUDA allocator raises, the helper unloads the models
(here: the probe's weights, dropped by the unload call) and the retried node's allocation succeeds.
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, inside, prepare_comfy_import, read_source, run  # noqa: E402 - importable only after the line above

HELPER = "applier_oom_retry.py"


def oom_error_type(model_management):
    oom = getattr(model_management, "OOM_EXCEPTION", None)
    if isinstance(oom, type) and oom is not Exception:
        return oom
    import torch
    return torch.cuda.OutOfMemoryError


class FlakyNode:
    """Raises a fresh error on each of its first `failures` calls, then returns "ok"."""

    def __init__(self, failures, error_type):
        self.failures, self.error_type = failures, error_type
        self.calls, self.raised = 0, []

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            error = self.error_type(f"CUDA out of memory. Tried to allocate 20.00 GiB (fake error #{self.calls} "
                                    "raised by applier's probe; nothing was allocated)")
            self.raised.append(error)
            raise error
        return "ok"

    async def run_async(self):
        return self()


class UnloadCounter:
    """Counts calls to model_management.unload_all_models (or unload_model in 2023 releases) during the probe."""

    def __init__(self, model_management):
        self.mm, self.count, self.name, self.original = model_management, 0, None, None
        for name in ("unload_all_models", "unload_model"):
            if model_management is not None and callable(getattr(model_management, name, None)):
                self.name, self.original = name, getattr(model_management, name)
                break

    def __enter__(self):
        if self.name:
            def counted(*args, **kwargs):
                self.count += 1
                return self.original(*args, **kwargs)
            setattr(self.mm, self.name, counted)
        return self

    def __exit__(self, *exc):
        if self.name:
            setattr(self.mm, self.name, self.original)


def run_case(helper, use_async, failures, error_type):
    """(calls, returned value or None, the exception raised or None, the node)."""
    node = FlakyNode(failures, error_type)
    try:
        if use_async:
            value = asyncio.run(helper.call_with_oom_retry_async("probe node", node.run_async))
        else:
            value = helper.call_with_oom_retry("probe node", node)
        return node.calls, value, None, node
    except Exception as exc:  # the case decides whether this is right
        return node.calls, None, exc, node


def check_mode(helper, mm, oom, use_async, numbers):
    """Problems found for one calling convention (sync or async); fills numbers."""
    tag = "async" if use_async else "sync"
    problems = []
    with UnloadCounter(mm) as unloads:
        calls, value, exc, _ = run_case(helper, use_async, 1, oom)
    numbers[f"{tag}_oom_once"] = {"calls": calls, "returned": value, "unloads": unloads.count,
                                  "raised": type(exc).__name__ if exc else None}
    if (calls, value, exc) != (2, "ok", None):
        problems.append(f"{tag}: one OOM gave {calls} call(s), result {value!r}, error {exc!r} (want 2 calls, 'ok')")
    elif unloads.name and unloads.count < 1:
        problems.append(f"{tag}: the retry ran without {unloads.name}() first")

    calls, value, exc, node = run_case(helper, use_async, 2, oom)
    first_raised = bool(node.raised) and exc is node.raised[0]
    numbers[f"{tag}_oom_twice"] = {"calls": calls, "raised_first_error": first_raised,
                                   "raised": type(exc).__name__ if exc else None}
    if calls != 2 or not first_raised:
        problems.append(f"{tag}: two OOMs gave {calls} call(s) and {'the first' if first_raised else 'not the first'}"
                        " error (want 2 calls and the first error re-raised)")

    calls, value, exc, _ = run_case(helper, use_async, 1, ValueError)
    numbers[f"{tag}_other_error"] = {"calls": calls, "raised": type(exc).__name__ if exc else None}
    if calls != 1 or not isinstance(exc, ValueError):
        problems.append(f"{tag}: a ValueError gave {calls} call(s) (want 1: only OOMs are retried)")
    return problems


class HeldWeights:
    """Stands for loaded models: tensors that the release's unload function drops."""

    def __init__(self):
        self.tensors = []

    def drop(self):
        self.tensors.clear()


def real_oom_case(helper, mm, use_async, numbers):
    """A real CUDA out-of-memory, recovered by unloading. Problems found (empty: it worked)."""
    import torch
    free, total = torch.cuda.mem_get_info()
    chunk = int(free * 0.6) // 4 * 4
    weights = HeldWeights()
    weights.tensors.append(torch.empty(chunk // 4, dtype=torch.float32, device="cuda"))
    calls, errors = [], []

    def node():
        calls.append(1)
        try:
            out = torch.empty(chunk // 4, dtype=torch.float32, device="cuda")   # more than is left
        except Exception as exc:
            errors.append(exc)
            raise
        return out.numel() * 4

    async def node_async():
        return node()

    name = next((n for n in ("unload_all_models", "unload_model") if callable(getattr(mm, n, None))), None)
    original = getattr(mm, name) if name else None
    if name:
        def unload_with_weights(*a, **kw):
            weights.drop()
            return original(*a, **kw)
        setattr(mm, name, unload_with_weights)
    try:
        if use_async:
            got = asyncio.run(helper.call_with_oom_retry_async("probe node (real OOM)", node_async))
        else:
            got = helper.call_with_oom_retry("probe node (real OOM)", node)
        failure = None
    except Exception as exc:
        got, failure = None, exc
    finally:
        if name:
            setattr(mm, name, original)
        weights.drop()
        torch.cuda.empty_cache()
    numbers["real_oom"] = {"gpu": torch.cuda.get_device_name(0), "free_bytes_before": free, "total_bytes": total,
                           "held_weights_bytes": chunk, "node_request_bytes": chunk, "calls": len(calls),
                           "first_error": type(errors[0]).__name__ if errors else None,
                           "retry_allocated_bytes": got, "failure": repr(failure) if failure else None}
    if not errors:
        return ["real OOM case: the first allocation did not fail (free memory changed under the probe?)"]
    if failure is not None or len(calls) != 2 or got != chunk:
        return [f"real OOM case: {len(calls)} call(s), result {got!r}, failure {failure!r} (want a successful "
                "retry after unloading)"]
    return []


def cuda_wanted(args):
    device = args.get("device", "auto")
    if device == "cpu":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def main(args):
    root = args.get("comfyui_root")
    if not root:
        return emit("SKIP", "the target has no ComfyUI root", {})
    expect_applied = (args.get("expect") or {}).get("applied")
    helper_path = os.path.join(root, HELPER)
    try:
        execution_text = read_source(os.path.join(root, "execution.py"))
    except OSError as exc:
        return emit("FAIL", f"cannot read execution.py: {exc}", {})
    uses_async = "call_with_oom_retry_async(" in execution_text
    wired = uses_async or "call_with_oom_retry(" in execution_text
    numbers = {"helper_present": os.path.isfile(helper_path), "execution_calls_helper": wired,
               "execution_is_async": uses_async}

    if not numbers["helper_present"]:
        if wired:
            return emit("FAIL", f"execution.py calls the retry helper but {HELPER} is missing: every node would "
                                "fail with ImportError", numbers)
        if expect_applied:
            return emit("FAIL", f"the patch is recorded as applied but {HELPER} is missing", numbers)
        return emit("PASS", "not applied: an OOM fails the prompt at once, as stock ComfyUI does", numbers)
    if not wired:
        outcome = "FAIL" if expect_applied else "WARN"
        return emit(outcome, f"{HELPER} exists but execution.py does not call it: OOMs are not retried", numbers)

    numbers["real_comfyui"] = prepare_comfy_import(root)
    import applier_oom_retry as helper
    if not inside(helper.__file__, root):
        return emit("FAIL", f"`import applier_oom_retry` loaded {helper.__file__}, not the target's", numbers)
    mm = helper._model_management()
    oom = oom_error_type(mm)
    numbers["oom_error"] = f"{oom.__module__}.{oom.__qualname__}"
    numbers["model_management"] = getattr(mm, "__file__", None)

    problems = check_mode(helper, mm, oom, uses_async, numbers)
    real = cuda_wanted(args)
    if real:
        problems += real_oom_case(helper, mm, uses_async, numbers)
    elif args.get("device") == "cuda":
        problems.append("--device cuda asked for a real out-of-memory, but torch sees no CUDA device")
    if problems:
        return emit("FAIL", "; ".join(problems), numbers)
    kind = "async" if uses_async else "sync"
    # Working, but not what the state says: someone applied it by hand, or the state was lost.
    outcome = "WARN" if expect_applied is False else "PASS"
    tail = "; but the state says the patch is not applied" if expect_applied is False else ""
    gpu = (f"; a real CUDA OOM ({numbers['real_oom']['node_request_bytes'] / 2**30:.1f} GiB asked with "
           f"{numbers['real_oom']['held_weights_bytes'] / 2**30:.1f} GiB of weights loaded) was retried after "
           "unloading and succeeded") if real else "; no GPU: the OOM was raised, not provoked"
    return emit(outcome, f"{oom.__name__} once: retried after unloading models and succeeded; twice: the first "
                        f"error re-raised; other errors: not retried ({kind} call site){gpu}{tail}", numbers)


if __name__ == "__main__":
    run(main)
