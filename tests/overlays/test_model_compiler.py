"""integration/model_compiler.py: one-off work of a family stays out of ComfyUI's malloc graph."""
import sys
import types

from fused_dit.integration import model_compiler


def test_without_the_compiler_the_context_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, model_compiler.PREFETCH_MODULE, raising=False)
    with model_compiler.outside_recorded_allocations():
        pass


def test_with_the_compiler_it_is_the_release_pause(monkeypatch):
    events = []

    class Pause:
        def __enter__(self):
            events.append("pause")

        def __exit__(self, *exc):
            events.append("resume")

    fake = types.ModuleType(model_compiler.PREFETCH_MODULE)
    fake.pause_malloc_graph = Pause
    monkeypatch.setitem(sys.modules, model_compiler.PREFETCH_MODULE, fake)
    with model_compiler.outside_recorded_allocations():
        events.append("measure")
    assert events == ["pause", "measure", "resume"]


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


def test_an_fp8_plan_prepares_its_stream_outside_the_record(monkeypatch):
    """The FP8 GEMM path's per-stream buffers (stats, the GEMM library's workspace) are made when a Linear's plan is
    built, inside the release's pause: the first recorded call then allocates what every later one does."""
    import torch
    from fused_dit.integration import fp8_modules
    events = []

    class Pause:
        def __enter__(self):
            events.append("pause")

        def __exit__(self, *exc):
            events.append("resume")

    fake = types.ModuleType(model_compiler.PREFETCH_MODULE)
    fake.pause_malloc_graph = Pause
    monkeypatch.setitem(sys.modules, model_compiler.PREFETCH_MODULE, fake)
    monkeypatch.setattr(fp8_modules.op, "prepare_stream",
                        lambda device, dtype: events.append(f"prepare {device.type} {dtype}"))
    linear = torch.nn.Linear(32, 16).to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    monkeypatch.setattr(fp8_modules, "decline_reason", lambda module, x: "the CPU")
    fp8_modules.fp8_plan_of(linear, x)                       # a declined Linear runs stock: nothing to prepare
    assert events == ["pause", "resume"]                     # its plan made outside the record all the same
    events.clear()
    monkeypatch.setattr(fp8_modules, "decline_reason", lambda module, x: None)    # as on an sm_89+ GPU
    monkeypatch.setattr(fp8_modules, "fp8_weight_of", lambda module: "codes")
    del linear.__dict__[fp8_modules._PLAN_ATTR]              # a new plan
    fp8_modules.fp8_plan_of(linear, x)
    fp8_modules.fp8_plan_of(linear, x)                       # the cached plan: nothing again
    assert events == ["pause", "prepare cpu torch.bfloat16", "resume"]


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
