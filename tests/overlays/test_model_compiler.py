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
