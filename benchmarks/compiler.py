"""ComfyUI's model compiler (issue 29, item 3): the node's configs sampled with the compiler on and off.

Since 2026-08-24 ComfyUI runs a "model compiler" by default where comfy-aimdo is on (DynamicVRAM on NVIDIA):
comfy/model_prefetch.py opens a comfy-aimdo malloc graph (`comfy_aimdo.malloc_graph.record(stream,
assert_graph_breaks)` on the first forward of a sampling run, `push()` on the later ones) around a model's block
loop, calls `graph.iterate("block")` before each block (through `prefetch_queue_pop(..., malloc_scope="block")`) and
`iterate(None)` after the last, then `pop()`, which reports a graph break where a frame's allocations differ from
what was recorded (`--assert-graph-breaks` makes a break an error: "aimdo memory compile error"). Where a caller
hands `prefetch_queue_pop` a `core` with `enable_graph=True`, a module's first call runs eagerly on a capture stream
and its next one is captured with `torch.cuda.graph` (the malloc graph paused around the CUDAGraph's creation,
synchronised, switched to the capture stream) and replayed on the calls after it. ComfyUI's flags:
`--disable-comfy-compiler`, `--disable-cuda-graphs`, `--assert-graph-breaks`. ComfyUI cleans up after each node
(execution.py: `cleanup_prefetch_queues`), so one malloc graph spans one KSampler call.

Which models the release's own files put under it is a fact of the tree: the command counts the calls the model
itself makes to `comfy.model_prefetch.malloc_graph_begin` (mode `release`). Since Flux's and Wan's block loops in
the files this project could read make none, the harness modes wrap their blocks the way model_prefetch.py wraps
the blocks of the models it does reach (Qwen-Image 2.1, MiniMax, LTX-AV), through ComfyUI's own per-block hook
(`patches_replace["dit"]`, what block-caching nodes use), on a clone of the MODEL the config hands to KSampler:

    off           --disable-comfy-compiler: no malloc graph, no capture
    release       the release as its main.py leaves it (compiler on where the tree has it); nothing added
    release_assert  release with --assert-graph-breaks: a break the malloc graph reports raises ("aimdo memory
                  compile error"), recorded as the run's error
    malloc_graph  a malloc graph around the block loop, iterate("block") before each block, iterate(None) + end
                  after the last (the release's own model_prefetch functions where the tree has them, else the
                  same comfy_aimdo.malloc_graph calls made here)
    cuda_graph    each block as prefetch_queue_pop(core=..., enable_graph=True) runs it: first call eager on the
                  capture stream, second captured with torch.cuda.graph and replayed, later calls replayed (inputs
                  copied into the captured buffers; a new input signature captures again), in PyTorch's graph pool
                  and with no malloc graph: with comfy-aimdo's record around it the harness's own static buffers
                  outlive their block's frame, which broke the record for stock too ("aimdo memory compile error",
                  2026-12-02), so this mode answers whether a block running the node can be captured and replayed,
                  and malloc_graph whether its allocations are alike from call to call

Per run: the error (exception text), graph breaks and rogue allocations the malloc graph reports, blocks
captured, replays, capture failures, s/step, peak memory, the output latent's max abs difference from the same
config with the compiler off, and speed against stock in the same mode and against stock with the compiler off.
`--tiny` runs the whole path on the CPU: the modes that need CUDA and comfy-aimdo are recorded as skipped.
What the harness does not cover is written into the results (`harness_limits`).

    python -m benchmarks compiler --comfyui DIR --tiny --out /tmp/compiler-tiny.json     # CPU smoke test
    python -m benchmarks compiler --comfyui TREE --models flux-dev --resolutions 1024x1024 \\
        --configs stock,node_defaults,overlay_all,overlay_all_fp8 --out benchmarks/results/compiler-RELEASE.json
    python -m benchmarks compiler --comfyui TREE --models qwen-image-2.1 --modes off,release,release_assert \\
        --out /tmp/compiler-qwen21.json     # a model whose own block loop the release compiles
"""
from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("run it as `python -m benchmarks compiler ...` from the repository root")

import contextlib
import dataclasses
import logging
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

from . import results
from .comfy_release import STARTED, import_comfyui
from .generation_configs import CONFIGS, ConfigSkipped, build_config, release_config
from .models import (MODELS, Loader, ModelUnavailable, add_model_arguments, check_device, check_model_arguments,
                     diffusion_model_class, free_memory, inputs_for, resolution_name, resolutions_of, sample,
                     synchronize)
from .models import import_paths  # noqa: F401  (the checkout and overlays/: the entry point asks this module)

MODES = ("off", "release", "release_assert", "malloc_graph", "cuda_graph")
# the release's own compiler, nothing added (release_assert: with --assert-graph-breaks, a break raises)
RELEASE_MODES = ("release", "release_assert")
HARNESS_MODES = ("malloc_graph", "cuda_graph")
# the node with every family on, FP8 attention included where the node offers it (attention_mode "fp8")
SCOPE = "block"
DEFAULT_CONFIGS = "stock,node_defaults,overlay_all,overlay_all_fp8,overlay_all_fp8_alongside,overlay_all_fp8_attn"
# the block lists a model's forward walks, and the patches_replace key each block is called through
BLOCK_LISTS = {"flux": (("double_blocks", "double_block"), ("single_blocks", "single_block")),
               "wan": (("blocks", "double_block"),),
               "qwen_image": (("transformer_blocks", "double_block"),),
               "qwen_image21": (("transformer_blocks", "single_block"),)}
HARNESS_LIMITS = [
    "blocks are wrapped through ComfyUI's patches_replace['dit'] hook, so what the forward allocates between "
    "blocks falls in the frame of the block before it, as it does in the model files the release compiles",
    "no prefetch queue: weights are not pinned per block ahead of use (prefetch_queue_pop's queue is None, as it is "
    "for a model that never calls make_prefetch_queue); DynamicVRAM's per-layer casts run as they do without it",
    "a captured block is replayed without the release's VBAR signature check (vbar_fault/vbar_signature_compare): "
    "nothing here evicts weights between steps, so the captured weight addresses stay valid; under VRAM pressure "
    "the release would capture again where this replays",
    "the CUDA-graph mode captures the blocks of diffusion models, which the release itself does only for modules "
    "whose callers pass core= and enable_graph=True (text-encoder decoding, MiniMax music)",
    "the CUDA-graph mode captures in PyTorch's graph pool, without comfy-aimdo's malloc graph: the release captures "
    "inside its malloc graph, where a replayed block's tensors land at the addresses of the record; the harness "
    "copies inputs into buffers of its own instead, which a malloc graph cannot hold across frames",
    "one KSampler call per malloc graph, cleaned up after it as execution.py does after a node; no server, no "
    "prompt queue",
]
NOTE = ("Weights are seeded random numbers: the figures are for speed, memory and which code ran. "
        "max_abs_diff_vs_off compares the output latent with the same config's run with the compiler off (same "
        "seed); speedup_vs_stock is against stock in the same mode, speedup_vs_stock_off against stock with the "
        "compiler off.")


# ------------------------------------------------------------------------------------- the malloc graph calls
class AimdoCalls:
    """comfy-aimdo's malloc graph driven here, call for call as comfy/model_prefetch.py drives it (begin: record
    on the first forward of a sampling run, push on the later ones; iterate per block; end: pop)."""

    def __init__(self, record, device, current_stream, assert_graph_breaks=False, kitchen=None):
        self.record = record                    # comfy_aimdo.malloc_graph.record
        self.device = device
        self.current_stream = current_stream    # device -> the stream ComfyUI computes on
        self.assert_graph_breaks = assert_graph_breaks
        self.kitchen = kitchen                  # comfy_kitchen where it has set_allocation_context
        self.graph = None
        self.active = False
        self.breaks = 0
        self.rogues = 0
        self.begins = 0
        self.breaks_per_call: list[int] = []    # per sampling call (the warm-up call first)

    def begin(self):
        if self.graph is None:
            self.graph = self.record(self.current_stream(self.device), self.assert_graph_breaks)
        else:
            self.graph.push()
        if self.kitchen is not None and hasattr(self.kitchen, "set_allocation_context"):
            self.kitchen.set_allocation_context(_Paused(self))
        self.active = True
        self.begins += 1

    def iterate(self, module):
        if self.active and self.graph.iterate(SCOPE if module is not None else None):
            self.breaks += 1

    def end(self):
        if self.active:
            self.active = False
            if self.graph.pop():
                self.breaks += 1

    def active_graph(self):
        return self.graph if self.active else None

    def cleanup(self):
        """What cleanup_malloc_graph does: abort a frame left open, count the rogues, drop the graph."""
        self.breaks_per_call.append(self.breaks - sum(self.breaks_per_call))
        graph, self.graph = self.graph, None
        if graph is None:
            return
        if self.active:
            self.active = False
            try:
                graph.abort()
            except Exception as error:   # recorded by the caller's log; the run already has its own error
                logging.getLogger(__name__).warning("malloc graph abort failed: %s", error)
        self.rogues += int(graph.rogue_count)


class _Paused:
    """The allocation context comfy-kitchen is handed (model_prefetch.pause_malloc_graph): pauses the graph."""

    def __init__(self, calls):
        self.calls = calls

    def __enter__(self):
        graph = self.calls.active_graph()
        if graph is not None:
            graph.pause()

    def __exit__(self, *exc):
        graph = self.calls.active_graph()
        if graph is not None:
            graph.resume()
        return False


class ReleaseCalls:
    """The release's own comfy.model_prefetch functions (a tree whose model_prefetch.py has malloc graphs)."""

    def __init__(self, prefetch, device):
        self.prefetch = prefetch
        self.device = device
        self.breaks = 0
        self.rogues = 0
        self.begins = 0
        self.breaks_per_call: list[int] = []    # per sampling call (the warm-up call first)

    def begin(self):
        self.prefetch.malloc_graph_begin(self.device)
        self.begins += 1

    def iterate(self, module):
        self.prefetch.prefetch_queue_pop(None, self.device, module, malloc_scope=SCOPE)

    def end(self):
        self.prefetch.malloc_graph_end()

    def active_graph(self):
        graph = self.prefetch.MALLOC_GRAPHS.get(threading.get_ident())
        return graph if graph is not None and getattr(graph, "_comfy_active", False) else None

    def cleanup(self):
        self.prefetch.cleanup_malloc_graph()
        self.breaks_per_call.append(self.prefetch.MALLOC_GRAPH_BREAKS)
        self.breaks += self.prefetch.MALLOC_GRAPH_BREAKS
        self.rogues += self.prefetch.MALLOC_GRAPH_ROGUES
        self.prefetch.cleanup_prefetch_queues()


def release_has_malloc_graphs(prefetch) -> bool:
    return prefetch is not None and all(hasattr(prefetch, name) for name in (
        "malloc_graph_begin", "malloc_graph_end", "cleanup_malloc_graph", "MALLOC_GRAPHS", "MALLOC_GRAPH_BREAKS"))


# ------------------------------------------------------------------------------------------ CUDA graph capture
class TorchCuda:
    """The CUDA calls the capture makes (a fake stands in for it in the CPU tests)."""

    def __init__(self, device):
        import torch
        self.torch = torch
        self.device = device
        self.capture_stream = None

    def stream(self):
        if self.capture_stream is None:
            self.capture_stream = self.torch.cuda.Stream(device=self.device)
        return self.capture_stream

    def current(self):
        return self.torch.cuda.current_stream(self.device)

    def synchronize(self):
        self.torch.cuda.synchronize(self.device)

    def new_graph(self):
        return self.torch.cuda.CUDAGraph()

    def capturing(self, graph, stream):
        return self.torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local")

    def on_stream(self, stream):
        return self.torch.cuda.stream(stream)

    def is_tensor(self, value):
        return isinstance(value, self.torch.Tensor)


def tree_map(value, leaf, is_tensor):
    """value with leaf(t) for every tensor in nested dicts, lists and tuples (other values kept as they are)."""
    if is_tensor(value):
        return leaf(value)
    if isinstance(value, dict):
        return {k: tree_map(v, leaf, is_tensor) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(tree_map(v, leaf, is_tensor) for v in value)
    return value


def tensor_leaves(value, is_tensor) -> list:
    found = []
    tree_map(value, lambda t: found.append(t) or t, is_tensor)
    return found


def signature(args: dict, is_tensor) -> tuple:
    """What a captured graph is bound to: each tensor's shape, dtype and device, in order (the host values the
    forward reads, transformer_options, are the same Python objects on every call of a block)."""
    return tuple((tuple(t.shape), str(t.dtype), str(t.device)) for t in tensor_leaves(
        {k: v for k, v in args.items() if k != "transformer_options"}, is_tensor))


@dataclasses.dataclass
class Captured:
    graph: object
    signature: tuple
    inputs: list            # the tensors the graph reads (copies of the capture call's inputs)
    outputs: dict           # the tensors it writes


class BlockCompiler:
    """ComfyUI's model compiler around one model's blocks, as a patches_replace['dit'] function per block.

    calls: AimdoCalls or ReleaseCalls (None: no malloc graph); cuda: TorchCuda (None: no CUDA-graph capture)."""

    def __init__(self, calls, cuda=None, total_blocks: int = 0):
        self.calls = calls
        self.cuda = cuda
        self.total_blocks = total_blocks
        self.position = 0                   # blocks called in this forward
        self.warmed: set = set()            # blocks whose eager first call ran (GRAPH_WARMED_MODULES)
        self.graphs: dict = {}              # block key -> Captured
        self.captures = 0
        self.replays = 0
        self.eager_calls = 0
        self.capture_failures: list[str] = []

    # ---- the per-block hook ComfyUI calls: fn(args, {"original_block": block_wrap})
    def replacement(self, key):
        def compiled_block(args, extra):
            return self.call(key, args, extra["original_block"])
        return compiled_block

    def call(self, key, args, original_block):
        if self.calls is not None and self.position == 0:
            self.calls.begin()
        self.position += 1
        hit = self.cuda is not None and key in self.graphs and \
            self.graphs[key].signature == signature(args, self.cuda.is_tensor)
        if self.calls is not None:
            self.calls.iterate(None if hit else key)
        if self.cuda is None:
            self.eager_calls += 1
            out = original_block(args)
        elif hit:
            out = self.replay(self.graphs[key], args)
        elif key in self.warmed:
            out = self.capture(key, args, original_block)
        else:
            out = self.warm(key, args, original_block)
        # after the last block (an exception leaves the frame open: the cleanup after the sampler aborts it, as
        # cleanup_malloc_graph does in the release)
        if self.position == self.total_blocks:
            self.position = 0
            if self.calls is not None:
                self.calls.iterate(None)
                self.calls.end()
        return out

    def warm(self, key, args, original_block):
        """The first call: eager, on the capture stream (the malloc graph told to follow it)."""
        cuda, graph = self.cuda, self.calls.active_graph() if self.calls is not None else None
        stream = cuda.stream()
        stream.wait_stream(cuda.current())
        with cuda.on_stream(stream), (graph.use_stream(stream) if graph is not None else contextlib.nullcontext()):
            out = original_block(args)
        cuda.current().wait_stream(stream)
        self.warmed.add(key)
        self.eager_calls += 1
        return out

    def capture(self, key, args, original_block):
        """The second call: captured with torch.cuda.graph as prefetch_queue_pop captures, then replayed."""
        cuda, graph = self.cuda, self.calls.active_graph() if self.calls is not None else None
        stream = cuda.stream()
        is_tensor = cuda.is_tensor
        static_args = tree_map({k: v for k, v in args.items() if k != "transformer_options"},
                               lambda t: t.clone(), is_tensor)
        static_args["transformer_options"] = args.get("transformer_options")
        if graph is not None:
            graph.pause()
        cuda_graph = cuda.new_graph()
        if graph is not None:
            graph.resume()
        cuda.synchronize()
        stream.wait_stream(cuda.current())
        if graph is not None:
            graph.pause(sync=True)
        try:
            with (graph.use_stream(stream) if graph is not None else contextlib.nullcontext()):
                with cuda.capturing(cuda_graph, stream):
                    if graph is not None:
                        graph.resume()
                    outputs = original_block(static_args)
                    if graph is not None:
                        graph.pause()
        except Exception as error:
            self.capture_failures.append(f"{key}: {type(error).__name__}: {error}"[:400])
            raise
        finally:
            if graph is not None:
                graph.resume(sync=True)
        cuda.current().wait_stream(stream)
        cuda_graph.replay()
        self.captures += 1
        inputs = tensor_leaves({k: v for k, v in static_args.items() if k != "transformer_options"}, is_tensor)
        self.graphs[key] = Captured(cuda_graph, signature(args, is_tensor), inputs, outputs)
        return outputs

    def replay(self, captured: Captured, args):
        sources = tensor_leaves({k: v for k, v in args.items() if k != "transformer_options"}, self.cuda.is_tensor)
        for static, source in zip(captured.inputs, sources):
            if static is not source:
                static.copy_(source)
        captured.graph.replay()
        self.replays += 1
        return captured.outputs

    def reset(self):
        """After a sampling call (or a failed one): the next block call opens a new forward."""
        self.position = 0

    def report(self) -> dict:
        return {"eager_block_calls": self.eager_calls, "blocks_captured": self.captures,
                "block_replays": self.replays, "capture_failures": self.capture_failures[:8]}


def block_keys(diffusion_model, family: str) -> list[tuple[str, int]]:
    """The patches_replace['dit'] keys of a model's blocks, in the order its forward calls them."""
    keys = []
    for attribute, kind in BLOCK_LISTS.get(family, ()):
        keys += [(kind, index) for index in range(len(getattr(diffusion_model, attribute, ())))]
    return keys


def install(patcher, keys, compiler: BlockCompiler):
    """A clone of the MODEL with the compiler's function on each block (ComfyUI's set_model_patch_replace)."""
    wrapped = patcher.clone()
    for kind, index in keys:
        wrapped.set_model_patch_replace(compiler.replacement((kind, index)), "dit", kind, index)
    return wrapped


# ------------------------------------------------------------------------------------------------ the runs
def mode_unavailable(mode: str, device: str, aimdo_ready: bool) -> str | None:
    """Why a mode cannot run here (None: it can)."""
    if mode in HARNESS_MODES or mode in RELEASE_MODES:
        if device != "cuda":
            return "needs CUDA (comfy-aimdo's malloc graph and torch.cuda.graph)"
        if not aimdo_ready and mode != "cuda_graph":
            return "needs comfy-aimdo on (DynamicVRAM started, comfy_aimdo.malloc_graph importable)"
    return None


@contextlib.contextmanager
def compiler_flags(args, mode: str, assert_graph_breaks: bool):
    """comfy.cli_args.args as the flags would set them for this mode, put back after."""
    names = ("disable_comfy_compiler", "disable_cuda_graphs", "assert_graph_breaks")
    saved = {name: getattr(args, name) for name in names if hasattr(args, name)}
    # cuda_graph: the harness's capture alone (a release's own malloc graph around it would hold its buffers)
    wanted = {"disable_comfy_compiler": mode in ("off", "cuda_graph"), "disable_cuda_graphs": mode == "off",
              "assert_graph_breaks": assert_graph_breaks or mode == "release_assert"}
    for name in saved:
        setattr(args, name, wanted[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(args, name, value)


class BeginCounter:
    """Counts the calls a model's own code makes to comfy.model_prefetch.malloc_graph_begin during a run."""

    def __init__(self, prefetch):
        self.prefetch = prefetch
        self.calls = 0

    def __enter__(self):
        self.original = getattr(self.prefetch, "malloc_graph_begin", None) if self.prefetch else None
        if self.original is not None:
            original = self.original

            def counted(*args, **kwargs):
                self.calls += 1
                return original(*args, **kwargs)
            self.prefetch.malloc_graph_begin = counted
        return self

    def __exit__(self, *exc):
        if self.original is not None:
            self.prefetch.malloc_graph_begin = self.original
        return False


class Session(Loader):
    """One process's model, latents of the compiler-off runs and stock timings."""

    def __init__(self, options, device: str, prefetch, aimdo_ready: bool):
        super().__init__(options, device)
        self.prefetch = prefetch
        self.aimdo_ready = aimdo_ready
        self.off_latents: dict = {}     # (model, resolution, config) -> latent with the compiler off
        self.stock: dict = {}           # (model, resolution, mode) -> stock s/step

    def calls_for(self, device):
        if release_has_malloc_graphs(self.prefetch):
            return ReleaseCalls(self.prefetch, device), "the release's comfy.model_prefetch functions"
        import comfy.model_management as mm
        import comfy_aimdo.malloc_graph
        kitchen = getattr(sys.modules.get("comfy.quant_ops"), "ck", None)
        return (AimdoCalls(comfy_aimdo.malloc_graph.record, device, mm.current_stream,
                           self.options.assert_graph_breaks, kitchen),
                "comfy_aimdo.malloc_graph called here as comfy/model_prefetch.py calls it")

    def run(self, spec, resolution, config: str, mode: str) -> dict:
        import torch
        from comfy.cli_args import args
        record = {"model": spec.key, "resolution": resolution_name(resolution), "config": config, "mode": mode,
                  "comfyui_version": STARTED.get("comfyui_version"), "vram_mode": STARTED.get("vram_mode"),
                  "date": results.now()}
        why = mode_unavailable(mode, self.device, self.aimdo_ready)
        if why:
            record["skipped"] = why
            return record
        patched = compiler = calls = None
        log = CompilerLog()
        try:
            diffusion_model_class(spec)
            base = self.load(spec, _Run(config))
            patched, details = build_config(config, base)
            record.update(details)
            if mode in RELEASE_MODES and release_has_malloc_graphs(self.prefetch):
                # nothing added: only the release's own counters, read when its malloc graph is cleaned up
                calls = ReleaseCalls(self.prefetch, torch.device(self.device, torch.cuda.current_device()))
            if mode in HARNESS_MODES:
                device = torch.device(self.device, torch.cuda.current_device())
                if mode == "malloc_graph":
                    calls, record["malloc_graph_calls"] = self.calls_for(device)
                keys = block_keys(base.model.diffusion_model, spec.family)
                compiler = BlockCompiler(calls, TorchCuda(device) if mode == "cuda_graph" else None, len(keys))
                patched = install(patched, keys, compiler)
                record["blocks_wrapped"] = len(keys)
            latent, noise, positive = inputs_for(spec, resolution, self.options.tiny, self.options.seed)
            with compiler_flags(args, mode, self.options.assert_graph_breaks), torch.inference_mode(), \
                    BeginCounter(self.prefetch) as begins:
                started = time.perf_counter()
                try:
                    new_sampling_run(base)
                    sample(patched, noise, latent, positive, self.options.warmup_steps, self.options.seed)
                finally:
                    self.cleanup(calls, compiler)
                synchronize(self.device)
                record["first_call_s"] = round(time.perf_counter() - started, 3)
                reset_peak(self.device)
                marks: list[float] = []

                def step_done(*_):
                    synchronize(self.device)
                    marks.append(time.perf_counter())
                started = time.perf_counter()
                try:
                    new_sampling_run(base)
                    out = sample(patched, noise, latent, positive, self.options.steps, self.options.seed,
                                 callback=step_done)
                finally:
                    self.cleanup(calls, compiler)
                synchronize(self.device)
                record["peak_gib"] = peak_gib(self.device)
                steps_s = [b - a for a, b in zip([started] + marks[:-1], marks)]
                later = steps_s[1:] or steps_s
                record["step_times_s"] = [round(s, 4) for s in steps_s]
                record["s_per_step"] = round(statistics.median(later), 4) if later else None
            record["release_malloc_graph_begins"] = begins.calls if self.prefetch is not None and \
                hasattr(self.prefetch, "malloc_graph_begin") else None
            out = out.float().cpu()
            record["output_finite"] = bool(torch.isfinite(out).all())
            self.compare(spec, resolution, config, mode, out, record)
        except (ConfigSkipped, ModelUnavailable) as reason:
            record["skipped"] = str(reason)
        except Exception as error:   # one run's failure must not lose the others
            record["error"] = f"{type(error).__name__}: {error}"[:2000]
            record["traceback"] = traceback.format_exc()[-4000:]
        finally:
            if calls is not None:
                record["graph_breaks"] = calls.breaks
                record["rogues"] = calls.rogues
                record["harness_begins"] = calls.begins
                record["graph_breaks_per_call"] = calls.breaks_per_call
            if compiler is not None:
                record.update(compiler.report())
            record["compiler_log"] = log.close()
            release_config(patched, self.patcher)
            del patched, compiler
            free_memory()
        return record

    def cleanup(self, calls, compiler=None):
        """What execution.py does after the sampler node: the malloc graph dropped, its breaks and rogues counted,
        the release's cleanup_prefetch_queues."""
        if compiler is not None:
            compiler.reset()
        if calls is not None:
            calls.cleanup()
        if not isinstance(calls, ReleaseCalls) and self.prefetch is not None and \
                hasattr(self.prefetch, "cleanup_prefetch_queues"):
            self.prefetch.cleanup_prefetch_queues()

    def compare(self, spec, resolution, config, mode, out, record):
        key = (spec.key, resolution_name(resolution), config)
        if mode == "off":
            self.off_latents[key] = out
        reference = self.off_latents.get(key)
        record["max_abs_diff_vs_off"] = None if reference is None else float((out - reference).abs().max())
        if config == "stock":
            self.stock[(key[0], key[1], mode)] = record["s_per_step"]
        for field, stock_mode in (("speedup_vs_stock", mode), ("speedup_vs_stock_off", "off")):
            stock = self.stock.get((key[0], key[1], stock_mode))
            record[field] = round(stock / record["s_per_step"], 3) if stock and record.get("s_per_step") else None


@dataclasses.dataclass(frozen=True)
class _Run:
    """What Loader.load reads of a run: weights and --fast (the node's configs all load bf16)."""
    config: str

    @property
    def load_key(self):
        return ("bf16", False)


class CompilerLog(logging.Handler):
    """The release's and fused_dit's log lines about the compiler and the node during one run."""

    WORDS = ("compiler", "malloc graph", "aimdo", "graph break", "fused_dit")
    LIMIT = 30

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.root = logging.getLogger()
        self.root.addHandler(self)

    def emit(self, record):
        message = record.getMessage()
        if any(w in message.lower() for w in self.WORDS) and message not in self.messages \
                and len(self.messages) < self.LIMIT:
            self.messages.append(message[:500])

    def close(self) -> list[str]:
        self.root.removeHandler(self)
        super().close()
        return self.messages


def new_sampling_run(patcher) -> None:
    """What a model keeps for one sampling run only is dropped before each (Qwen-Image 2.1's prefix K/V cache: the
    runs of this command share one loaded model, and a run must not read K/V another config computed)."""
    diffusion_model = getattr(getattr(patcher, "model", None), "diffusion_model", None)
    reset = getattr(diffusion_model, "reset_prefix_cache", None)
    if callable(reset):
        reset(getattr(diffusion_model, "prefix_cache_enabled", False))


def reset_peak(device):
    if device == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device):
    if device != "cuda":
        return None
    import torch
    return round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)


def plan(options) -> list[tuple]:
    """(model, resolution, config, mode): per config, the compiler-off run first (the others compare with it),
    stock first of all (speedups)."""
    configs = sorted(options.configs, key=lambda c: c != "stock")
    planned = []
    for model_key in options.models:
        spec = MODELS[model_key]
        for resolution in resolutions_of(spec, options):
            for config in configs:
                for mode in sorted(options.modes, key=MODES.index):
                    planned.append((spec, resolution, config, mode))
    return planned


def tree_compiler(prefetch) -> dict:
    """What the tree's comfy/model_prefetch.py offers."""
    if prefetch is None:
        return {"model_prefetch": False}
    return {"model_prefetch": True, "malloc_graphs": release_has_malloc_graphs(prefetch),
            "cuda_graphs": hasattr(prefetch, "GRAPH_WARMED_MODULES")}


def add_arguments(parser) -> None:
    add_model_arguments(parser, models="flux-dev", steps=3, warmup_steps=2)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help="comma list of configs: " + ", ".join(CONFIGS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    parser.add_argument("--assert-graph-breaks", action="store_true",
                        help="ComfyUI's flag: a malloc graph break is an error")
    parser.add_argument("--work-dir", type=Path, help="with --save-checkpoint: where the weights are written")
    parser.add_argument("--save-checkpoint", action="store_true",
                        help="write the random weights as safetensors in --work-dir and load them from the file")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no run after this many seconds (the rest recorded as skipped)")


def run(options, parser) -> int:
    check_model_arguments(options, parser)
    options.configs = [c for c in options.configs.split(",") if c]
    unknown = [c for c in options.configs if c not in CONFIGS]
    options.modes = [m for m in options.modes.split(",") if m]
    unknown += [m for m in options.modes if m not in MODES]
    if unknown:
        parser.error(f"unknown configs or modes: {unknown}")
    if options.save_checkpoint and not options.work_dir:
        parser.error("--save-checkpoint needs --work-dir")
    options.load_outside_inference_mode = False
    began = time.perf_counter()
    comfyui = import_comfyui(options.comfyui.resolve(), options.device, options.allocator,
                             options.disable_dynamic_vram)
    check_device(options.device)
    prefetch = _import_prefetch()
    aimdo_ready = comfyui.get("vram_mode") == "dynamic" and _has_malloc_graph()
    report = {"benchmark": "compiler", "script": "benchmarks/compiler.py", "note": NOTE,
              "environment": _environment(options.device, comfyui),
              "tree_compiler": {**tree_compiler(prefetch), "comfy_aimdo_malloc_graph": _has_malloc_graph()},
              "harness_limits": HARNESS_LIMITS,
              "settings": {"steps": options.steps, "warmup_steps": options.warmup_steps, "seed": options.seed,
                           "tiny": options.tiny, "modes": options.modes,
                           "assert_graph_breaks": options.assert_graph_breaks,
                           "s_per_step": "median of the timed call's steps after its first"},
              "setup": [], "runs": []}
    session = Session(options, options.device, prefetch, aimdo_ready)
    for spec, resolution, config, mode in plan(options):
        print(f"{spec.key} {resolution_name(resolution)} {config} [{mode}] ...", flush=True)
        if options.time_budget is not None and time.perf_counter() - began > options.time_budget:
            record = {"model": spec.key, "resolution": resolution_name(resolution), "config": config, "mode": mode,
                      "skipped": f"--time-budget {options.time_budget:g} s spent before this run"}
        else:
            record = session.run(spec, resolution, config, mode)
        report["runs"].append(record)
        report["setup"] = session.setup
        results.write_json(report, options.out)
        print("  " + ", ".join(f"{k} {record.get(k)}" for k in (
            "s_per_step", "speedup_vs_stock", "graph_breaks", "blocks_captured", "max_abs_diff_vs_off", "error",
            "skipped") if record.get(k) is not None), flush=True)
    session.unload()
    print(f"wrote {options.out}")
    return 0


def _import_prefetch():
    try:
        import comfy.model_prefetch as prefetch
        return prefetch
    except Exception:   # an older tree, or comfy-aimdo without what this model_prefetch.py imports
        return None


def _has_malloc_graph() -> bool:
    try:
        import comfy_aimdo.malloc_graph  # noqa: F401
        return True
    except Exception:
        return False


def _environment(device, comfyui) -> dict:
    import os
    import fused_dit
    env = results.environment(device)
    env.update({"device": device, "comfyui": comfyui, "fused_dit": fused_dit.__version__,
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")})
    return env
