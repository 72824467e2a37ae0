"""benchmarks/compiler.py's harness with fakes (no CUDA, no comfy-aimdo, no ComfyUI): the order of the malloc-graph
calls around a model's blocks, the eager first call, the capture, the replay, and what a run records."""
from __future__ import annotations

import contextlib
import types

import pytest

from benchmarks import compiler


class Events(list):
    pass


class FakeGraph:
    """comfy_aimdo.malloc_graph.MallocGraph's calls, logged; pop/iterate report breaks from a script."""

    def __init__(self, events, breaks=()):
        self.events = events
        self.breaks = list(breaks)
        self.rogue_count = 2

    def push(self):
        self.events.append("push")

    def pop(self):
        self.events.append("pop")
        return bool(self.breaks and self.breaks.pop(0))

    def iterate(self, name=None):
        self.events.append(f"iterate {name}")
        return False

    def abort(self):
        self.events.append("abort")

    def pause(self, sync=False):
        self.events.append(f"pause{' sync' if sync else ''}")

    def resume(self, sync=False):
        self.events.append(f"resume{' sync' if sync else ''}")

    @contextlib.contextmanager
    def use_stream(self, stream):
        self.events.append(f"use_stream {stream}")
        yield


class FakeTensor:
    def __init__(self, value, shape=(2,)):
        self.value = value
        self.shape = shape
        self.dtype = "bf16"
        self.device = "cuda:0"

    def clone(self):
        return FakeTensor(self.value, self.shape)

    def copy_(self, other):
        self.value = other.value


class FakeStream:
    def __init__(self, name, events):
        self.name = name
        self.events = events

    def wait_stream(self, other):
        self.events.append(f"{self.name} waits {other.name}")

    def __str__(self):
        return self.name


class FakeCudaGraph:
    def __init__(self, events):
        self.events = events
        self.body = None

    def replay(self):
        self.events.append("replay")
        if self.body:
            self.body()


class FakeCuda:
    """TorchCuda's calls: a capture runs the block once (recording it as the graph's body), replay reruns it."""

    def __init__(self, events):
        self.events = events
        self.capture_stream = FakeStream("capture", events)
        self.main = FakeStream("main", events)
        self.graph = None

    def stream(self):
        return self.capture_stream

    def current(self):
        return self.main

    def synchronize(self):
        self.events.append("synchronize")

    def new_graph(self):
        self.graph = FakeCudaGraph(self.events)
        return self.graph

    @contextlib.contextmanager
    def capturing(self, graph, stream):
        self.events.append("capture begin")
        yield
        self.events.append("capture end")

    @contextlib.contextmanager
    def on_stream(self, stream):
        self.events.append(f"on {stream}")
        yield

    def is_tensor(self, value):
        return isinstance(value, FakeTensor)


def make_calls(events, breaks=()):
    graph = FakeGraph(events, breaks)
    made = []

    def record(stream, assert_graph_breaks):
        events.append(f"record assert={assert_graph_breaks}")
        made.append(graph)
        return graph
    calls = compiler.AimdoCalls(record, "cuda:0", lambda device: FakeStream("main", events))
    return calls, graph


def block(events, name):
    def original_block(args):
        events.append(f"run {name} {args['img'].value}")
        return {"img": FakeTensor(args["img"].value + 1)}
    return original_block


def forward(bc, keys, events, value=0):
    """One model forward: each block through its patches_replace function, as Flux's forward_orig calls it."""
    img = FakeTensor(value)
    for key in keys:
        out = bc.replacement(key)({"img": img, "transformer_options": {}}, {"original_block": block(events, key[1])})
        img = out["img"]
    return img


KEYS = [("double_block", 0), ("single_block", 0)]


def test_malloc_graph_mode_brackets_the_block_loop_as_model_prefetch_does():
    events = Events()
    calls, _ = make_calls(events)
    bc = compiler.BlockCompiler(calls, None, len(KEYS))
    forward(bc, KEYS, events)
    forward(bc, KEYS, events)
    assert events == ["record assert=False", "iterate block", "run 0 0", "iterate block", "run 0 1",
                      "iterate None", "pop",
                      "push", "iterate block", "run 0 0", "iterate block", "run 0 1", "iterate None", "pop"]
    assert calls.begins == 2 and calls.breaks == 0 and bc.eager_calls == 4


def test_breaks_are_counted_and_cleanup_aborts_an_open_frame_and_counts_rogues():
    events = Events()
    calls, graph = make_calls(events, breaks=[True])
    bc = compiler.BlockCompiler(calls, None, len(KEYS))
    forward(bc, KEYS, events)
    assert calls.breaks == 1
    calls.begin()              # a forward cut off before its end
    calls.cleanup()
    assert events[-1] == "abort" and calls.rogues == graph.rogue_count and calls.graph is None
    calls.cleanup()            # the next sampling call's cleanup: its own breaks, none
    assert calls.breaks_per_call == [1, 0]


def test_cuda_graph_mode_runs_eager_first_then_captures_then_replays():
    events = Events()
    calls, _ = make_calls(events)
    cuda = FakeCuda(events)
    bc = compiler.BlockCompiler(calls, cuda, len(KEYS))
    first = forward(bc, KEYS, events)
    assert bc.eager_calls == 2 and bc.captures == 0 and "capture begin" not in events
    assert "use_stream capture" in events and "on capture" in events        # the warm call runs on the capture stream
    events.clear()
    second = forward(bc, KEYS, events)
    assert bc.captures == 2 and bc.replays == 0
    # the capture sequence of prefetch_queue_pop: graph made with the malloc graph paused, a device sync, the
    # malloc graph paused with a sync, then resumed inside the capture and paused again before it ends
    start = events.index("synchronize")
    assert events[start - 2:start] == ["pause", "resume"]
    assert events[start + 1:start + 8] == ["capture waits main", "pause sync", "use_stream capture", "capture begin",
                                           "resume", "run 0 0", "pause"]
    assert events[start + 8:start + 12] == ["capture end", "resume sync", "main waits capture", "replay"]
    events.clear()
    third = forward(bc, KEYS, events, value=5)
    assert bc.replays == 2 and not any(e.startswith("run") for e in events)
    assert events.count("iterate None") == 3          # a replayed block's frame is skipped, as a graph hit is
    assert first.value == second.value == 2
    # a replay copies the call's inputs into the tensors the graph reads, and hands back the ones it writes
    assert bc.graphs[KEYS[0]].inputs[0].value == 5 and third is bc.graphs[KEYS[1]].outputs["img"]


def test_a_new_input_signature_captures_again():
    events = Events()
    bc = compiler.BlockCompiler(None, FakeCuda(events), 1)
    key = [("double_block", 0)]
    for _ in range(3):
        forward(bc, key, events)
    assert bc.captures == 1 and bc.replays == 1
    img = FakeTensor(0, shape=(4,))
    bc.replacement(key[0])({"img": img, "transformer_options": {}}, {"original_block": block(events, 0)})
    assert bc.captures == 2


def test_a_capture_failure_is_recorded_and_raised():
    events = Events()
    calls, _ = make_calls(events)
    bc = compiler.BlockCompiler(calls, FakeCuda(events), 1)
    key = ("double_block", 0)
    calls_made = []

    def syncing_block(args):
        calls_made.append(1)
        if len(calls_made) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return {"img": args["img"]}
    bc.replacement(key)({"img": FakeTensor(0), "transformer_options": {}}, {"original_block": syncing_block})
    with pytest.raises(RuntimeError):
        bc.replacement(key)({"img": FakeTensor(0), "transformer_options": {}}, {"original_block": syncing_block})
    assert bc.capture_failures and "stream is capturing" in bc.capture_failures[0]
    assert events[-1] == "resume sync"     # resumed after a failed capture; the frame stays open for the cleanup
    bc.reset()
    assert bc.position == 0


def test_modes_that_need_cuda_are_skipped_on_the_cpu():
    assert compiler.mode_unavailable("off", "cpu", False) is None
    for mode in ("release", "release_assert", "malloc_graph", "cuda_graph"):
        assert "CUDA" in compiler.mode_unavailable(mode, "cpu", False)
        assert compiler.mode_unavailable(mode, "cuda", True) is None
    for mode in ("release", "release_assert", "malloc_graph"):
        assert "aimdo" in compiler.mode_unavailable(mode, "cuda", False)
    # the CUDA-graph mode captures in PyTorch's graph pool: no malloc graph needed
    assert compiler.mode_unavailable("cuda_graph", "cuda", False) is None


def test_compiler_flags_set_what_the_cli_would_and_are_put_back():
    args = types.SimpleNamespace(disable_comfy_compiler=False, disable_cuda_graphs=False, assert_graph_breaks=False)
    with compiler.compiler_flags(args, "off", False):
        assert args.disable_comfy_compiler and args.disable_cuda_graphs
    with compiler.compiler_flags(args, "cuda_graph", True):
        # the harness's capture alone: the release's own malloc graph stays off around it
        assert args.disable_comfy_compiler and not args.disable_cuda_graphs and args.assert_graph_breaks
    with compiler.compiler_flags(args, "malloc_graph", False):
        assert not args.disable_comfy_compiler
    assert args == types.SimpleNamespace(disable_comfy_compiler=False, disable_cuda_graphs=False,
                                         assert_graph_breaks=False)
    with compiler.compiler_flags(args, "release_assert", False):   # the release's compiler, a break raises
        assert not args.disable_comfy_compiler and not args.disable_cuda_graphs and args.assert_graph_breaks
    with compiler.compiler_flags(args, "release", False):
        assert not args.assert_graph_breaks
    older = types.SimpleNamespace()          # a release without the flags: nothing set
    with compiler.compiler_flags(older, "off", False):
        assert vars(older) == {}


def test_the_release_functions_are_used_where_the_tree_has_malloc_graphs():
    events = Events()
    prefetch = types.SimpleNamespace(
        MALLOC_GRAPHS={}, MALLOC_GRAPH_BREAKS=3, MALLOC_GRAPH_ROGUES=1,
        malloc_graph_begin=lambda device: events.append("begin"), malloc_graph_end=lambda: events.append("end"),
        cleanup_malloc_graph=lambda: events.append("cleanup graph"),
        cleanup_prefetch_queues=lambda: events.append("cleanup queues"),
        prefetch_queue_pop=lambda queue, device, module, malloc_scope=None: events.append(
            f"pop {queue} {'block' if module is not None else None} {malloc_scope}"))
    assert compiler.release_has_malloc_graphs(prefetch)
    assert not compiler.release_has_malloc_graphs(types.SimpleNamespace(cleanup_prefetch_queues=None))
    calls = compiler.ReleaseCalls(prefetch, "cuda:0")
    forward(compiler.BlockCompiler(calls, None, len(KEYS)), KEYS, events)
    calls.cleanup()
    assert [e for e in events if not e.startswith("run")] == [
        "begin", "pop None block block", "pop None block block", "pop None None block", "end",
        "cleanup graph", "cleanup queues"]
    assert (calls.breaks, calls.rogues) == (3, 1)


def test_block_keys_follow_the_forward_order():
    model = types.SimpleNamespace(double_blocks=[1, 2], single_blocks=[3])
    assert compiler.block_keys(model, "flux") == [("double_block", 0), ("double_block", 1), ("single_block", 0)]
    assert compiler.block_keys(types.SimpleNamespace(blocks=[1]), "wan") == [("double_block", 0)]
    # Qwen-Image 2.1 calls its blocks through patches_replace['dit'][("single_block", i)]
    assert compiler.block_keys(types.SimpleNamespace(transformer_blocks=[1, 2]), "qwen_image21") == [
        ("single_block", 0), ("single_block", 1)]


def test_install_puts_one_replace_function_per_block_on_a_clone():
    patched = []

    class Patcher:
        def clone(self):
            return self

        def set_model_patch_replace(self, fn, name, kind, index):
            patched.append((name, kind, index, callable(fn)))
    compiler.install(Patcher(), KEYS, compiler.BlockCompiler(None))
    assert patched == [("dit", "double_block", 0, True), ("dit", "single_block", 0, True)]


def test_plan_runs_stock_first_and_the_compiler_off_run_first_per_config():
    options = types.SimpleNamespace(models=["flux-dev"], configs=["overlay_all", "stock"], tiny=True,
                                    resolutions=set(), modes=["cuda_graph", "off"])
    planned = [(config, mode) for _, _, config, mode in compiler.plan(options)]
    assert planned == [("stock", "off"), ("stock", "cuda_graph"), ("overlay_all", "off"),
                       ("overlay_all", "cuda_graph")]


def test_a_run_compares_with_its_configs_compiler_off_latent_and_with_stock():
    import torch
    session = compiler.Session.__new__(compiler.Session)
    session.off_latents, session.stock = {}, {}
    spec = types.SimpleNamespace(key="flux-dev")
    records = {}
    for config, mode, value, seconds in (("stock", "off", 0.0, 1.0), ("stock", "cuda_graph", 0.0, 0.5),
                                         ("overlay_all", "off", 1.0, 0.8), ("overlay_all", "cuda_graph", 1.5, 0.4)):
        record = {"s_per_step": seconds}
        session.compare(spec, (64, 64), config, mode, torch.full((2,), value), record)
        records[(config, mode)] = record
    assert records[("overlay_all", "cuda_graph")]["max_abs_diff_vs_off"] == 0.5
    assert records[("overlay_all", "cuda_graph")]["speedup_vs_stock"] == 1.25
    assert records[("overlay_all", "cuda_graph")]["speedup_vs_stock_off"] == 2.5
    assert records[("stock", "off")]["max_abs_diff_vs_off"] == 0.0


def test_the_command_is_registered_and_its_result_kind_described():
    from benchmarks import __main__ as entry, results
    assert entry.COMMANDS["compiler"][0] == "compiler"
    assert any(pattern.startswith("compiler-") for pattern in results.KINDS)


def test_each_sampling_run_starts_without_another_runs_prefix_cache():
    """Qwen-Image 2.1 keeps its text prefix's K/V for one sampling run; the command's runs share one model, so the
    cache is reset (keeping it enabled as it was) before each sampling call."""
    calls = []
    diffusion_model = types.SimpleNamespace(prefix_cache_enabled=True,
                                            reset_prefix_cache=lambda enabled: calls.append(enabled))
    compiler.new_sampling_run(types.SimpleNamespace(model=types.SimpleNamespace(diffusion_model=diffusion_model)))
    compiler.new_sampling_run(types.SimpleNamespace(model=types.SimpleNamespace(diffusion_model=object())))
    assert calls == [True]
