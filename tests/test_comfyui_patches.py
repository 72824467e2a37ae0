"""The comfyui/* patches (max-resolution, pil-pixel-limit, oom-retry) on ComfyUI-shaped trees of every era, their
effect probes, and, where the upstream cache exists, every cached real ComfyUI snapshot."""
from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from applier import diffengine
from applier.catalog import load_catalog
from applier.catalog.check import is_release_version
from applier.catalog.planner import choose_variant
from applier.detect import detect
from applier.diffengine import HunkState
from applier.errors import HunkConflict
from tests.fixtures.comfy_tree import ERAS, STOCK_PIL_LIMIT, build_comfy_tree, eras

REPO = Path(__file__).resolve().parent.parent
PROBES = REPO / "verify" / "probes"
# python -m benchmarks upstream comfyui --cache DIR fills DIR/comfyui; point APPLIER_UPSTREAM_CACHE at DIR to check it.
UPSTREAM_CACHE = Path(os.environ.get("APPLIER_UPSTREAM_CACHE") or "/nonexistent-upstream-cache") / "comfyui"
PATCH_IDS = ("comfyui/max-resolution", "comfyui/oom-retry", "comfyui/pil-pixel-limit")
PATCHED_MAX_RESOLUTION = 40960
HELPER = "applier_oom_retry.py"
LAYOUTS = (("git", False), ("plain", False), ("portable", True))   # portable trees in the wild are often CRLF


@pytest.fixture(scope="module")
def comfy_patches():
    patches = {p.id: p for p in load_catalog() if p.component == "comfyui"}
    assert sorted(patches) == sorted(PATCH_IDS)
    return patches


def comfyui_root_of(tree: Path) -> Path:
    return tree / "ComfyUI" if (tree / "python_embeded").is_dir() else tree


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts}


def apply_variant(root: Path, variant, *, reverse: bool = False) -> None:
    """Plan every file with the diff engine, then write: the test's stand-in for the transaction layer."""
    file_patches = diffengine.parse_patch(variant.read_diff())
    if reverse:
        file_patches = diffengine.reverse_patches(file_patches)
    plans = [diffengine.plan_file(fp, (root / fp.path).read_bytes() if (root / fp.path).exists() else None)
             for fp in file_patches]
    for plan in plans:
        path = root / plan.path
        if plan.new is None:
            path.unlink()
        else:
            path.write_bytes(plan.new)


def select(tree: Path, patch):
    """The variant the planner picks for this tree (by version when detected, else by a clean dry run)."""
    target = detect(tree, gpu=False)
    variant, _, how = choose_variant(target, patch)
    return variant, how, target


def run_probe(name: str, comfyui_root: Path, expect: dict) -> dict:
    args = {"device": "cpu", "comfyui_root": str(comfyui_root), "site_packages": None, "expect": expect}
    proc = subprocess.run([sys.executable, "-I", str(PROBES / f"{name}.py"), json.dumps(args)],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{name} printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------ the fixture itself

def test_eras_list_every_era_with_its_version():
    listed = eras()
    assert set(listed) == set(ERAS)
    assert listed["latest"] is not None and listed["2023-06"] is None
    assert all(v is None or is_release_version(v) for v in listed.values())


@pytest.mark.parametrize("layout,crlf", LAYOUTS)
def test_detection_reads_the_fixture_like_a_real_install(tmp_path, layout, crlf):
    tree = build_comfy_tree(tmp_path / "t", era="latest", layout=layout, crlf=crlf)
    target = detect(tree, gpu=False)
    assert target.comfyui_root == comfyui_root_of(tree).resolve()
    assert target.comfyui_version == ERAS["latest"].version
    assert target.layout == {"git": "git-checkout", "plain": "plain", "portable": "portable"}[layout]
    nodes = (target.comfyui_root / "nodes.py").read_bytes()
    assert (b"\r\n" in nodes) == crlf and (nodes.count(b"\n") == nodes.count(b"\r\n")) == crlf


def test_git_fixture_without_version_is_untagged_and_with_version_is_tagged(tmp_path):
    old = build_comfy_tree(tmp_path / "old", era="2024-10", layout="git")
    new = build_comfy_tree(tmp_path / "new", era="0.3.45", layout="git")
    tags = [subprocess.run(["git", "-C", str(t), "tag"], capture_output=True, text=True, check=True).stdout.split()
            for t in (old, new)]
    assert tags == [[], ["v0.3.45"]]
    assert not (old / "comfyui_version.py").exists() and detect(old, gpu=False).comfyui_version is None


def test_resolution_cap_scan_finds_the_fixtures_hard_coded_caps(tmp_path):
    from applier.resources import load_verify
    load_verify()
    resolution = importlib.import_module("applier_verify.checks.resolution")
    root = build_comfy_tree(tmp_path / "t", era="latest", layout="plain")
    found = {(cap.file, cap.value) for cap in resolution.scan_resolution_caps(root, PATCHED_MAX_RESOLUTION).caps}
    assert ("custom_nodes/SomePack/__init__.py", 16384) in found
    assert ("comfy_extras/nodes_load_3d.py", 4096) in found
    assert not any(f == "comfy_extras/nodes_images.py" for f, _ in found)   # it copies nodes.MAX_RESOLUTION


# ------------------------------------------------------------------------------------------ selection

@pytest.mark.parametrize("era", list(ERAS))
def test_each_era_selects_the_variant_written_for_it(tmp_path, comfy_patches, era):
    tree = build_comfy_tree(tmp_path / "t", era=era, layout="git")
    for patch_id, patch in comfy_patches.items():
        variant, how, target = select(tree, patch)
        assert variant.name == ERAS[era].variants[patch_id], how
        version = target.comfyui_version
        by_dry_run = version is None or (not patch.variants_for(version) and patch.is_past_some_variant(version))
        assert ("dry run" in how or "applies cleanly" in how) == by_dry_run, how
        if version is not None and by_dry_run:
            assert f"comfyui {version} is outside every variant's range" in how


@pytest.mark.parametrize("era", [name for name, version in eras().items() if version is None])
def test_unversioned_eras_have_exactly_one_clean_variant_and_no_claiming_one(tmp_path, comfy_patches, era):
    root = build_comfy_tree(tmp_path / "t", era=era, layout="plain")
    for patch in comfy_patches.values():
        clean = [v.name for v in patch.variants if dry_run_is_clean(v, root)]
        assert clean == [ERAS[era].variants[patch.id]]


def dry_run_is_clean(variant, root: Path) -> bool:
    try:
        for fp in diffengine.parse_patch(variant.read_diff()):
            path = root / fp.path
            plan = diffengine.plan_file(fp, path.read_bytes() if path.exists() else None)
            if any(h.state is not HunkState.NOT_APPLIED for h in plan.hunks):
                return False
    except HunkConflict:
        return False
    return True


def test_versioned_variants_never_overlap_and_unversioned_ones_claim_no_release(comfy_patches):
    from packaging.specifiers import SpecifierSet
    # Every release ComfyUI could have (its first tag is v0.0.1); the "<0.0.1" variants share only versions below it.
    probes = [f"0.{minor}.{micro}" for minor in range(0, 4) for micro in range(1, 70)] + ["0.22.1", "0.38.4", "1.0.0"]
    for patch in comfy_patches.values():
        for version in probes:
            assert len(patch.variants_for(version)) <= 1, (patch.id, version)
        for variant in patch.variants:
            if variant.versions == SpecifierSet("<0.0.1"):
                assert not variant.tested   # no release exists for these eras: they are served by the dry run


# ------------------------------------------------------------------------------------------ apply, probe, revert

@pytest.mark.parametrize("layout,crlf", LAYOUTS)
@pytest.mark.parametrize("era", list(ERAS))
def test_apply_all_raises_max_resolution_and_revert_is_byte_identical(tmp_path, comfy_patches, era, layout, crlf):
    tree = build_comfy_tree(tmp_path / "t", era=era, layout=layout, crlf=crlf)
    root = comfyui_root_of(tree)
    before = snapshot(root)
    chosen = [select(tree, comfy_patches[pid])[0] for pid in PATCH_IDS]
    for variant in chosen:
        apply_variant(root, variant)

    report = run_probe("comfy_import", root, {"applied": True, "max_resolution": PATCHED_MAX_RESOLUTION})
    assert report["outcome"] == "PASS", report
    assert report["numbers"]["empty_latent_width_max"] == PATCHED_MAX_RESOLUTION
    nodes = (root / "nodes.py").read_bytes()
    if crlf:
        assert nodes.count(b"\n") == nodes.count(b"\r\n"), "a bare LF was written into a CRLF file"
    assert (root / HELPER).is_file()
    for patch_id, variant in zip(PATCH_IDS, chosen):
        for fp in diffengine.parse_patch(variant.read_diff()):
            assert diffengine.classify_file(fp, (root / fp.path).read_bytes()) is diffengine.FileState.APPLIED, \
                (patch_id, fp.path)

    for variant in reversed(chosen):
        apply_variant(root, variant, reverse=True)
    assert snapshot(root) == before


def test_max_resolution_and_pil_limit_commute(tmp_path, comfy_patches):
    results = []
    for order in (("comfyui/max-resolution", "comfyui/pil-pixel-limit"),
                  ("comfyui/pil-pixel-limit", "comfyui/max-resolution")):
        root = build_comfy_tree(tmp_path / "-".join(p.split("/")[1] for p in order), era="latest", layout="plain")
        for patch_id in order:
            apply_variant(root, select(root, comfy_patches[patch_id])[0])
        results.append((root / "nodes.py").read_bytes())
    assert results[0] == results[1]


def test_reapplying_is_refused_by_state_not_applied_twice(tmp_path, comfy_patches):
    root = build_comfy_tree(tmp_path / "t", era="latest", layout="plain")
    variant = select(root, comfy_patches["comfyui/max-resolution"])[0]
    apply_variant(root, variant)
    patched = (root / "nodes.py").read_bytes()
    fp = diffengine.parse_patch(variant.read_diff())[0]
    plan = diffengine.plan_file(fp, patched)
    assert [h.state for h in plan.hunks] == [HunkState.APPLIED] and plan.new == patched


@pytest.mark.parametrize("era", ["2023-06", "latest"])
def test_pil_probe_sees_the_limit_raised_to_max_resolution_squared(tmp_path, comfy_patches, era):
    root = build_comfy_tree(tmp_path / "t", era=era, layout="plain")
    stock = run_probe("pil_limit", root, {"applied": False})
    assert stock["outcome"] == "PASS", stock
    apply_variant(root, select(root, comfy_patches["comfyui/pil-pixel-limit"])[0])
    apply_variant(root, select(root, comfy_patches["comfyui/max-resolution"])[0])
    patched = run_probe("pil_limit", root, {"applied": True})
    assert patched["outcome"] == "PASS", patched
    assert patched["numbers"]["max_image_pixels"] == PATCHED_MAX_RESOLUTION ** 2
    if stock["numbers"]["pillow"] is None:
        assert stock["numbers"]["max_image_pixels"] == STOCK_PIL_LIMIT


def test_pil_probe_fails_when_the_state_says_applied_but_the_limit_is_stock(tmp_path):
    root = build_comfy_tree(tmp_path / "t", era="latest", layout="plain")
    report = run_probe("pil_limit", root, {"applied": True})
    assert report["outcome"] == "FAIL" and report["numbers"]["max_resolution_squared"] == 16384 ** 2


def test_comfy_import_probe_fails_when_the_state_disagrees_with_the_tree(tmp_path):
    root = build_comfy_tree(tmp_path / "t", era="latest", layout="plain")
    report = run_probe("comfy_import", root, {"applied": True, "max_resolution": PATCHED_MAX_RESOLUTION})
    assert report["outcome"] == "FAIL" and report["numbers"]["empty_latent_width_max"] == 16384


# ------------------------------------------------------------------------------------------ oom-retry behaviour

# Runs inside the tree (its nodes, execution and comfy.model_management), prints one JSON line per scenario.
OOM_DRIVER = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import comfy.model_management as mm
import execution, nodes

class FlakyNode:
    failures = 0
    calls = 0
    raised = []
    @classmethod
    def INPUT_TYPES(s):
        return {"required": {"width": ("INT", {"max": nodes.MAX_RESOLUTION})}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    def run(self, width):
        FlakyNode.calls += 1
        mm.CALLS.append("node")
        if FlakyNode.calls <= FlakyNode.failures:
            error = mm.OOM_EXCEPTION(f"CUDA out of memory (fake #{FlakyNode.calls})")
            FlakyNode.raised.append(error)
            raise error
        return (width * 2,)

nodes.NODE_CLASS_MAPPINGS["FlakyNode"] = FlakyNode
for failures in (0, 1, 2):
    FlakyNode.failures, FlakyNode.calls, FlakyNode.raised = failures, 0, []
    del mm.CALLS[:]
    executor = execution.PromptExecutor()
    executor.execute({"1": {"class_type": "FlakyNode", "inputs": {"width": 21}}}, "prompt-1")
    print(json.dumps({"failures": failures, "success": executor.success, "calls": FlakyNode.calls,
                      "output": executor.outputs.get("1"), "calls_log": list(mm.CALLS),
                      "message": (executor.error or {}).get("exception_message"),
                      "first_error_reported": bool(FlakyNode.raised) and executor.exception is FlakyNode.raised[0]}))
'''


def run_oom_driver(root: Path) -> tuple[dict[int, dict], str]:
    proc = subprocess.run([sys.executable, "-I", "-c", OOM_DRIVER, str(root)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {run["failures"]: run for run in runs}, proc.stderr


@pytest.mark.parametrize("era", list(ERAS))
def test_oom_once_is_retried_and_twice_fails_with_the_first_error(tmp_path, comfy_patches, era):
    spec = ERAS[era]
    stock_root = build_comfy_tree(tmp_path / "stock", era=era, layout="plain")
    root = build_comfy_tree(tmp_path / "patched", era=era, layout="plain")
    apply_variant(root, select(root, comfy_patches["comfyui/oom-retry"])[0])

    stock, _ = run_oom_driver(stock_root)
    assert stock[1]["success"] is False and stock[1]["calls"] == 1        # stock ComfyUI: no retry

    runs, log = run_oom_driver(root)
    assert runs[0]["success"] and runs[0]["calls"] == 1 and runs[0]["output"] == [42]
    once = runs[1]
    assert once["success"] and once["calls"] == 2 and once["output"] == [42]
    # models unloaded and the cache emptied between the failed call and the retry
    assert once["calls_log"][:2] == ["node", "unload_all_models"] and once["calls_log"][-1] == "node"
    assert "soft_empty_cache" in once["calls_log"]
    assert "succeeded on the retry" in log

    twice = runs[2]
    assert not twice["success"] and twice["calls"] == 2
    assert twice["first_error_reported"], "the prompt must fail with the first OOM, not the retry's"
    assert "fake #1" in twice["message"]
    if spec.oom_handler == "tips":
        assert "ran out of memory on your GPU" in twice["message"]
    if spec.oom_handler != "none":   # ComfyUI's own handler still runs on the re-raised error
        assert twice["calls_log"][-1] == "unload_all_models"
    assert "ran out of memory again on the retry" in log


@pytest.mark.parametrize("era", ["2024-08", "0.3.43", "latest"])
def test_oom_probe_passes_on_patched_trees_and_reports_stock_ones(tmp_path, comfy_patches, era):
    stock_root = build_comfy_tree(tmp_path / "stock", era=era, layout="plain")
    stock = run_probe("oom_retry", stock_root, {"applied": False})
    assert stock["outcome"] == "PASS" and stock["numbers"]["helper_present"] is False
    assert run_probe("oom_retry", stock_root, {"applied": True})["outcome"] == "FAIL"

    root = build_comfy_tree(tmp_path / "patched", era=era, layout="plain")
    apply_variant(root, select(root, comfy_patches["comfyui/oom-retry"])[0])
    report = run_probe("oom_retry", root, {"applied": True})
    assert report["outcome"] == "PASS", report
    mode = "async" if ERAS[era].is_async else "sync"
    assert report["numbers"][f"{mode}_oom_once"] == {"calls": 2, "returned": "ok", "unloads": 1, "raised": None}
    assert report["numbers"][f"{mode}_oom_twice"]["raised_first_error"] is True


def test_oom_probe_fails_when_execution_calls_a_missing_helper(tmp_path, comfy_patches):
    root = build_comfy_tree(tmp_path / "t", era="latest", layout="plain")
    apply_variant(root, select(root, comfy_patches["comfyui/oom-retry"])[0])
    (root / HELPER).unlink()
    report = run_probe("oom_retry", root, {"applied": True})
    assert report["outcome"] == "FAIL" and "missing" in report["reason"]


# ------------------------------------------------------------------------------------------ the helper, in-process

@pytest.fixture()
def helper(tmp_path, comfy_patches, monkeypatch):
    """applier_oom_retry as the patch creates it, with a stand-in comfy.model_management."""
    variant = comfy_patches["comfyui/oom-retry"].variant("async-execute-hidden-inputs")
    created = [fp for fp in diffengine.parse_patch(variant.read_diff()) if fp.is_new]
    assert [fp.path for fp in created] == [HELPER]
    path = tmp_path / HELPER
    path.write_bytes(diffengine.plan_file(created[0], None).new)
    spec = importlib.util.spec_from_file_location("applier_oom_retry_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class FakeOOM(RuntimeError):
        pass
    calls = []
    mm = SimpleNamespace(OOM_EXCEPTION=FakeOOM, unload_all_models=lambda: calls.append("unload"),
                         soft_empty_cache=lambda: calls.append("empty"))
    monkeypatch.setattr(module, "_model_management", lambda: mm)
    return SimpleNamespace(module=module, mm=mm, oom=FakeOOM, calls=calls)


def test_every_variant_creates_the_same_helper(comfy_patches):
    bodies = {variant.name: [diffengine.plan_file(fp, None).new for fp in diffengine.parse_patch(variant.read_diff())
                             if fp.is_new]
              for variant in comfy_patches["comfyui/oom-retry"].variants}
    assert len({tuple(b) for b in bodies.values()}) == 1 and all(len(b) == 1 for b in bodies.values())


def test_the_helper_is_shipped_once_and_each_variant_holds_only_its_call_line(comfy_patches):
    patch = comfy_patches["comfyui/oom-retry"]
    shared = {path.name for v in patch.variants for path in v.shared}
    assert shared == {"helper.diff"}
    for variant in patch.variants:
        own = diffengine.parse_patch(variant.diff_path.read_bytes())
        assert [fp.path for fp in own] == ["execution.py"], variant.name
        assert variant.read_diff() == b"".join(p.read_bytes() for p in (*variant.shared, variant.diff_path))


def test_a_release_between_the_ranges_is_served_by_a_clean_dry_run_or_not_applicable(tmp_path, comfy_patches):
    """0.3.76-0.14.x: no variant's range covers them (nobody has read their files yet). A clean dry run decides, as
    for a release past the catalog, and says so; a text no variant fits is not applicable, with the reason."""
    from applier.catalog.planner import plan_patch
    tree = build_comfy_tree(tmp_path / "t", era="0.38", layout="plain")
    (tree / "comfyui_version.py").write_text('__version__ = "0.5.0"\n')
    oom = comfy_patches["comfyui/oom-retry"]
    plan = plan_patch(detect(tree, gpu=False), oom)
    assert plan.action == "apply" and plan.variant.name == ERAS["0.38"].variants[oom.id]
    assert "comfyui 0.5.0 is outside every variant's range" in plan.reason and "dry run" in plan.reason
    (tree / "execution.py").write_text("def execute(node):\n    return node()\n")
    plan = plan_patch(detect(tree, gpu=False), oom)
    assert plan.action == "not-applicable" and "between the variants' ranges" in plan.reason


def test_pil_pixel_limit_is_refused_on_a_tree_without_max_resolution(tmp_path, comfy_patches):
    """Checkouts of 2023-01..03-21 had the hunk's context but no MAX_RESOLUTION: applying would break the import."""
    from applier.catalog.planner import plan_apply
    from applier.errors import RefusedError
    root = build_comfy_tree(tmp_path / "t", era="2023-04", layout="plain")
    nodes = root / "nodes.py"
    nodes.write_text(nodes.read_text().replace("MAX_RESOLUTION=8192\n", "").replace("MAX_RESOLUTION", "8192"))
    target = detect(root, gpu=False)
    pil = comfy_patches["comfyui/pil-pixel-limit"]
    with pytest.raises(RefusedError, match="MAX_RESOLUTION"):
        plan_apply(target, [pil], explicit=True)
    (plan,) = plan_apply(target, [pil])
    assert plan.action == "not-applicable" and "nodes.py has no line matching" in plan.reason


def test_retry_frees_the_failed_attempts_locals_before_running_again(helper):
    class Big:
        pass
    seen_at_retry = []
    refs = []

    def node():
        if not refs:
            big = Big()                     # stands for the tensors the failed attempt allocated
            refs.append(weakref.ref(big))
            raise helper.oom("out of memory")
        gc.collect()
        seen_at_retry.append(refs[0]() is not None)
        return "ok"

    assert helper.module.call_with_oom_retry("n", node) == "ok"
    assert seen_at_retry == [False] and helper.calls == ["unload", "empty"]


def test_non_oom_errors_pass_through_without_retry(helper):
    attempts = []

    def node():
        attempts.append(1)
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        helper.module.call_with_oom_retry("n", node)
    assert len(attempts) == 1 and helper.calls == []


def test_a_different_error_on_the_retry_is_raised_as_it_is(helper):
    errors = [helper.oom("out of memory"), KeyError("missing")]

    def node():
        raise errors.pop(0)

    with pytest.raises(KeyError):
        helper.module.call_with_oom_retry("n", node)


def test_async_retry_returns_the_second_result_and_reraises_the_first_error(helper):
    state = {"calls": 0, "first": None}

    async def node(fail_times):
        state["calls"] += 1
        if state["calls"] <= fail_times:
            error = helper.oom(f"out of memory #{state['calls']}")
            state["first"] = state["first"] or error
            raise error
        return "ok"

    assert asyncio.run(helper.module.call_with_oom_retry_async("n", node, 1)) == "ok"
    state.update(calls=0, first=None)
    with pytest.raises(helper.oom) as caught:
        asyncio.run(helper.module.call_with_oom_retry_async("n", node, 2))
    assert caught.value is state["first"] and state["calls"] == 2


def test_release_is_oom_is_preferred_and_a_catch_all_oom_exception_is_not_trusted(helper):
    module = helper.module
    helper.mm.is_oom = lambda ex: "memory" in str(ex)
    assert module.is_oom(ValueError("memory"), helper.mm) and not module.is_oom(helper.oom("x"), helper.mm)
    # torch builds without torch.cuda.OutOfMemoryError make ComfyUI set OOM_EXCEPTION = Exception.
    broad = SimpleNamespace(OOM_EXCEPTION=Exception)
    assert not module.is_oom(ValueError("bad input"), broad)
    assert module.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), broad)


# ------------------------------------------------------------------------------------------ real upstream files

def cached_snapshots() -> list[Path]:
    if not UPSTREAM_CACHE.is_dir():
        return []
    return sorted(p for p in UPSTREAM_CACHE.iterdir() if (p / "nodes.py").is_file())


@pytest.mark.slow
@pytest.mark.skipif(not cached_snapshots(), reason=f"no ComfyUI upstream cache at {UPSTREAM_CACHE} "
                    "(python -m benchmarks upstream comfyui fills it; CI has none)")
def test_every_cached_upstream_snapshot_has_exactly_one_clean_variant_that_round_trips(comfy_patches):
    parsed = {(p.id, v.name): diffengine.parse_patch(v.read_diff()) for p in comfy_patches.values() for v in p.variants}
    problems = []
    for snap in cached_snapshots():
        label = snap.name
        files = {f.name: f.read_bytes() for f in snap.glob("*.py")}
        meta = json.loads((snap / "SNAPSHOT.json").read_text()) if (snap / "SNAPSHOT.json").is_file() else {}
        version = meta.get("version") if is_release_version(label) else None
        for patch in comfy_patches.values():
            forward = {}
            for variant in patch.variants:
                try:
                    plans = [diffengine.plan_file(fp, files.get(fp.path)) for fp in parsed[patch.id, variant.name]]
                except HunkConflict:
                    continue
                if all(h.state is HunkState.NOT_APPLIED for plan in plans for h in plan.hunks):
                    forward[variant.name] = plans
            if len(forward) != 1:
                problems.append(f"{label} {patch.id}: clean variants {sorted(forward)}")
                continue
            (name, plans), = forward.items()
            if version is not None and [v.name for v in patch.variants_for(version)] != [name]:
                problems.append(f"{label} {patch.id}: version {version} selects "
                                f"{[v.name for v in patch.variants_for(version)]}, the clean one is {name}")
            for fp, plan in zip(parsed[patch.id, name], plans):
                back = diffengine.plan_file(diffengine.reverse_file_patch(fp), plan.new)
                if back.new != files.get(fp.path):
                    problems.append(f"{label} {patch.id}: {fp.path}: apply + reverse is not byte-identical")
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(not cached_snapshots(), reason=f"no ComfyUI upstream cache at {UPSTREAM_CACHE}")
@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
def test_gnu_patch_agrees_on_the_cached_snapshots(comfy_patches, tmp_path):
    """An independent oracle: GNU patch without fuzz applies exactly the variants the diff engine finds clean."""
    disagreements = []
    for snap in cached_snapshots()[::7]:        # a spread across the eras keeps this quick
        for patch in comfy_patches.values():
            for variant in patch.variants:
                combined = tmp_path / f"{patch.name}-{variant.name}.diff"   # shared diffs + the variant's own
                combined.write_bytes(variant.read_diff())
                gnu = subprocess.run(["patch", "--dry-run", "-F0", "-p1", "-s", "-f", "-i", str(combined)],
                                     cwd=snap, capture_output=True).returncode == 0
                if gnu != dry_run_is_clean(variant, snap):
                    disagreements.append(f"{snap.name} {patch.id} {variant.name}: GNU patch {gnu}")
    assert not disagreements, "\n".join(disagreements)
