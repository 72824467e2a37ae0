"""integration/model_compiler.py: one-off work of a family stays out of ComfyUI's malloc graph."""
import contextlib
import sys
import threading
import types

from fused_dit.integration import model_compiler


def test_without_the_compiler_the_context_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, model_compiler.PREFETCH_MODULE, raising=False)
    with model_compiler.outside_recorded_allocations():
        pass


def _recording(monkeypatch, active=True):
    graph = types.SimpleNamespace(_comfy_active=active)
    fake = types.ModuleType(model_compiler.PREFETCH_MODULE)
    fake.MALLOC_GRAPHS = {threading.get_ident(): graph}
    fake.pause_malloc_graph = lambda sync=False: (_ for _ in ()).throw(AssertionError("never the release's pause"))
    monkeypatch.setitem(sys.modules, model_compiler.PREFETCH_MODULE, fake)
    return graph


def test_recording_is_the_release_malloc_graph_open_on_this_thread(monkeypatch):
    monkeypatch.delitem(sys.modules, model_compiler.PREFETCH_MODULE, raising=False)
    assert not model_compiler.recording()
    graph = _recording(monkeypatch)
    assert model_compiler.recording()
    graph._comfy_active = False                  # between forwards: malloc_graph_end closed it
    assert not model_compiler.recording()


def test_the_context_never_calls_the_release_pause_and_off_cuda_does_nothing(monkeypatch):
    """The release's pause is one flag it also sets itself (Qwen-Image 2.1's prefix pass): a pause and resume of
    ours inside it would resume the record halfway. Off CUDA there is nothing to keep out of a record."""
    _recording(monkeypatch)
    ran = []
    with model_compiler.outside_recorded_allocations():
        with model_compiler.outside_recorded_allocations():
            ran.append("inner")
    assert ran == ["inner"]


def test_kept_values_pass_through_outside_the_context():
    import torch
    value = (torch.zeros(2), [torch.ones(1)], None)
    assert model_compiler.kept(value) is value
    assert [t.numel() for t in model_compiler._tensors(value)] == [2, 1]


def test_a_shape_first_seen_inside_a_capture_is_not_measured_there(monkeypatch):
    """The compiler captures a block on its second call; a shape new to the attention family inside a capture
    runs without timing (which would sync the host and end the capture) and is measured on its next eager call."""
    import test_attention as fixtures
    from fused_dit.integration import attention
    override = attention.FastestSdpa(timer=fixtures.fake_timer, devices=("cpu",))
    monkeypatch.setattr(model_compiler, "capturing", lambda tensor: True)
    fixtures.ran_first.clear()
    override(fixtures.attention_pytorch, *fixtures.qkv(), 2, skip_reshape=True)
    assert fixtures.ran_first == ["flash"] and override.choices == {}        # the release's order, once, unmeasured
    monkeypatch.setattr(model_compiler, "capturing", lambda tensor: False)
    override(fixtures.attention_pytorch, *fixtures.qkv(), 2, skip_reshape=True)
    assert list(override.choices.values()) == ["cudnn"]


def test_the_fp8_mode_runs_exact_for_a_shape_first_seen_inside_a_capture(monkeypatch):
    import torch
    from fused_dit.integration import attention_fp8
    ran = []

    def exact(q, k, v, heads, **kwargs):
        ran.append("exact")
        return q
    override = attention_fp8.Fp8Attention(timer=lambda fn: (fn(), 1.0)[1], devices=("cpu",))
    monkeypatch.setattr(model_compiler, "capturing", lambda tensor: True)
    monkeypatch.setattr(override, "_kernel", lambda *args: ran.append("kernel"))
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(attention_fp8.kernel, "refusal", lambda *args: None)
    override(exact, q, q, q, 2, skip_reshape=True)
    assert ran == ["exact"] and override.choices == {}


def test_capturing_is_false_off_cuda():
    import torch
    assert model_compiler.capturing(torch.zeros(1)) is False


def test_an_fp8_plan_is_made_outside_the_record_and_kept_for_the_recorded_stream(monkeypatch):
    """What a Linear's plan holds outlives the call: it is made inside outside_recorded_allocations and its tensors
    marked as the recorded stream's (model_compiler.kept); a cached plan is not made again."""
    import torch
    from fused_dit.integration import fp8_modules
    events = []

    @contextlib.contextmanager
    def outside():
        events.append("outside")
        yield
        events.append("back")
    monkeypatch.setattr(model_compiler, "outside_recorded_allocations", outside)
    monkeypatch.setattr(model_compiler, "kept", lambda value: events.append("kept") or value)
    linear = torch.nn.Linear(32, 16).to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    fp8_modules.fp8_plan_of(linear, x)
    fp8_modules.fp8_plan_of(linear, x)
    assert events == ["outside", "kept", "back"]


def test_the_node_prepares_the_fp8_stream_before_the_models_forward(monkeypatch):
    """The FP8 GEMM path's per-stream buffers are made in the APPLY_MODEL wrapper, before the diffusion model's
    forward opens the compiler's record, on the input's CUDA device (nothing on the CPU or without FP8)."""
    import torch
    import blocks
    from fused_dit import registry
    from fused_dit.ops import fp8_linear
    prepared = []
    monkeypatch.setattr(fp8_linear, "prepare_stream", lambda device, dtype: prepared.append((device.type, dtype)))
    model, _ = blocks.make_flux_stack()
    with registry.enabled(model, ("norm_rope",), device=torch.device("cuda", 0)):
        pass
    with registry.enabled(model, ("fp8_linear",), device=torch.device("cpu")):
        pass
    assert prepared == []
    monkeypatch.setattr(registry, "_enable", lambda model, ops: None)
    with registry.enabled(model, ("fp8_linear",), device=torch.device("cuda", 0)):
        pass
    assert prepared == [("cuda", torch.bfloat16), ("cuda", torch.float16)]


def test_preparing_a_stream_off_cuda_does_nothing():
    import torch
    from fused_dit.ops import fp8_linear
    assert fp8_linear.prepare_stream(torch.device("cpu"), torch.bfloat16) is False


def test_inside_a_capture_a_linear_without_a_plan_runs_stock_and_keeps_nothing(monkeypatch):
    """What a plan keeps (codes, a bias copy) must not be allocated in a CUDA graph's pool, where a later free
    outside the graph breaks the allocator: a Linear first met inside a capture runs stock for that call."""
    import torch
    from fused_dit.integration import fp8_modules
    monkeypatch.setattr(model_compiler, "capturing", lambda tensor: True)
    linear = torch.nn.Linear(32, 16).to(torch.bfloat16)
    plan = fp8_modules.fp8_plan_of(linear, torch.randn(4, 32, dtype=torch.bfloat16))
    assert plan.decline_reason == fp8_modules.CAPTURED_FIRST and plan.weight is None
    assert fp8_modules._PLAN_ATTR not in linear.__dict__


def test_resident_codes_are_not_kept_from_inside_a_capture(monkeypatch):
    import torch
    from fused_dit.integration import fp8_weights
    monkeypatch.setattr(model_compiler, "capturing", lambda tensor: True)
    linear = torch.nn.Linear(32, 16).to(torch.bfloat16)
    linear.__dict__["_v_weight"] = linear.weight
    token = fp8_weights._KEEP_RESIDENT_CODES.set(True)
    try:
        assert fp8_weights.resident_codes(linear, linear.weight) is None
    finally:
        fp8_weights._KEEP_RESIDENT_CODES.reset(token)
    assert fp8_weights.RESIDENT_CODES_ATTR not in linear.__dict__
