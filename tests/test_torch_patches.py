"""The torch patch families of the catalog, against the real torch installed in the test environment.

The installed torch is never modified. Each test copies the files a patch needs (torch/cuda/*.py,
torch/version.py, the torch-*.dist-info with its RECORD) into a temporary site-packages, patches the copy with the
diff engine, and checks the result three ways: by hash against torch's own RECORD, by running the patch's effect
probe, and by reversing the patch back to RECORD-identical bytes.

How a probe sees the patched copy: a copy of torch/cuda alone cannot be imported (torch is one package with
compiled parts), so the probe runs in a fresh interpreter through OVERLAY_BOOTSTRAP: it imports the installed
torch, then loads each patched module from the temporary copy under its real name, puts it in sys.modules and
rebinds the names the parent package took from the old module (`torch.cuda.Stream` comes from
`torch.cuda.streams`), and finally runs the probe unchanged. The probe reports the file it inspected
(`numbers["module_file"]`), which the tests use to prove that the copy, not the installed file, was checked.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import os
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from applier import diffengine
from applier.catalog import load_catalog, load_patch
from applier.catalog.check import CellState, check_catalog
from applier.errors import HunkConflict
from applier.resources import PATCHES_DIR

REPO = Path(__file__).resolve().parent.parent
PROBES = REPO / "verify" / "probes"
# python -m benchmarks upstream torch --cache DIR fills DIR/torch; point APPLIER_UPSTREAM_CACHE at DIR to check it.
UPSTREAM_CACHE = Path(os.environ.get("APPLIER_UPSTREAM_CACHE") or "/nonexistent-upstream-cache")
PROBE_TIMEOUT_S = 180
# find_spec locates the installed torch without importing it (importing takes seconds and is not needed here).
TORCH_SITE_PACKAGES = Path(importlib.util.find_spec("torch").origin).parent.parent
TORCH_PATCH_IDS = ("torch/cuda-error-recovery", "torch/pinned-mapped", "torch/sm89-limits", "torch/stream-priority")

OVERLAY_BOOTSTRAP = r"""
import importlib, importlib.util, os, runpy, sys
overlay_root, probe, payload, *module_names = sys.argv[1:]
import torch
for name in module_names:
    old = importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, os.path.join(overlay_root, *name.split(".")) + ".py")
    new = importlib.util.module_from_spec(spec)
    sys.modules[name] = new
    spec.loader.exec_module(new)
    parent = sys.modules[name.rpartition(".")[0]]
    setattr(parent, name.rpartition(".")[2], new)
    for attr, value in vars(old).items():
        if getattr(value, "__module__", None) == name and getattr(parent, attr, None) is value:
            setattr(parent, attr, getattr(new, attr))
sys.argv = [probe, payload]
runpy.run_path(probe, run_name="__main__")
"""


# ---------------------------------------------------------------------------------------------------- helpers

def record_sha256(site_packages: Path) -> dict[str, str]:
    """torch's RECORD as {relative path: urlsafe-b64 sha256} for the files copied into a test layout."""
    record = next(site_packages.glob("torch-*.dist-info")) / "RECORD"
    hashes = {}
    with record.open(newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if len(row) >= 2 and row[1].startswith("sha256="):
                hashes[row[0]] = row[1].removeprefix("sha256=")
    return hashes


def file_sha256(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def installed_torch_version(site_packages: Path) -> str:
    text = (site_packages / "torch" / "version.py").read_text(encoding="utf-8")
    return re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M).group(1)


def copy_torch_layout(source: Path, dest: Path) -> list[str]:
    """Copy torch/cuda/*.py, torch/version.py and the dist-info; return the copied .py files' relative paths."""
    copied = []
    for path in sorted((source / "torch" / "cuda").glob("*.py")) + [source / "torch" / "version.py"]:
        relative = path.relative_to(source).as_posix()
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / relative)
        copied.append(relative)
    dist_info = next(source.glob("torch-*.dist-info"))
    (dest / dist_info.name).mkdir(parents=True)
    for name in ("METADATA", "RECORD"):
        shutil.copy2(dist_info / name, dest / dist_info.name / name)
    return copied


def apply_diff(diff: bytes, root: Path, *, reverse: bool = False) -> list[str]:
    """Plan every file of diff against root with the engine and write the results; return the changed paths."""
    changed = []
    for file_patch in diffengine.parse_patch(diff):
        target = root / file_patch.path
        if reverse:
            file_patch = diffengine.reverse_file_patch(file_patch)
        plan = diffengine.plan_file(file_patch, target.read_bytes())
        target.write_bytes(plan.new)
        changed.append(file_patch.path)
    return changed


def run_probe_on_overlay(probe: str, site_packages: Path, overlaid: list[str], applied: bool,
                         workdir: Path) -> dict:
    modules = [p.removesuffix(".py").replace("/", ".") for p in overlaid]
    args = {"device": "auto", "site_packages": str(site_packages), "comfyui_root": None,
            "expect": {"applied": applied}}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", OVERLAY_BOOTSTRAP, str(site_packages), str(PROBES / f"{probe}.py"),
         json.dumps(args), *modules],
        cwd=workdir, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0 and lines, f"probe {probe} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def torch_catalog():
    return {p.id: p for p in load_catalog(PATCHES_DIR) if p.component == "torch"}


@pytest.fixture
def torch_copy(tmp_path):
    site_packages = tmp_path / "site-packages"
    copied = copy_torch_layout(TORCH_SITE_PACKAGES, site_packages)
    return site_packages, copied


# ------------------------------------------------------------------------------------------- catalog shape

def test_catalog_holds_the_four_torch_patches_with_their_probes(torch_catalog):
    assert sorted(torch_catalog) == sorted(TORCH_PATCH_IDS)
    for patch in torch_catalog.values():
        assert patch.summary and patch.reach and patch.risks, patch.id
        assert (PROBES / f"{patch.effect_probe}.py").is_file(), patch.id


def test_torch_variants_never_claim_one_version_twice(torch_catalog):
    for patch in torch_catalog.values():
        tested = {t for v in patch.variants for t in v.tested}
        for version in tested | {"2.4.0", "2.9.0", "2.10.0", "2.15.0", "2.15.9"}:
            assert len(patch.variants_for(version)) <= 1, (patch.id, version)


def test_torch_variants_cover_every_release_through_2_15_and_stop_before_2_16(torch_catalog):
    for patch in torch_catalog.values():
        assert patch.variants_for("2.15.0") and patch.variants_for("2.15.3"), patch.id
        assert not patch.variants_for("2.16.0"), patch.id
        for variant in patch.variants:
            assert variant.tested and all(variant.covers(t) for t in variant.tested), (patch.id, variant.name)


def test_torch_diffs_only_touch_files_under_torch_cuda(torch_catalog):
    for patch in torch_catalog.values():
        for variant in patch.variants:
            paths = [fp.path for fp in diffengine.parse_patch(variant.read_diff())]
            assert paths and all(p.startswith("torch/cuda/") and ".." not in p for p in paths), paths


def test_exactly_one_variant_fits_the_installed_torch(torch_catalog):
    version = installed_torch_version(TORCH_SITE_PACKAGES)
    for patch in torch_catalog.values():
        assert len(patch.variants_for(version)) == 1, (patch.id, version)


# ------------------------------------------------------------------------- apply / probe / revert on a copy

@pytest.mark.slow
@pytest.mark.parametrize("patch_id", TORCH_PATCH_IDS)
def test_patch_applies_to_a_copy_of_installed_torch_and_reverts_to_record(patch_id, torch_catalog, torch_copy,
                                                                          tmp_path):
    site_packages, copied = torch_copy
    record = record_sha256(site_packages)
    assert all(file_sha256(site_packages / p) == record[p] for p in copied), "the copy is not pristine"
    patch = torch_catalog[patch_id]
    (variant,) = patch.variants_for(installed_torch_version(site_packages))

    changed = apply_diff(variant.read_diff(), site_packages)
    for relative in copied:
        patched = relative in changed
        assert (file_sha256(site_packages / relative) != record[relative]) is patched, relative

    applied = run_probe_on_overlay(patch.effect_probe, site_packages, changed, True, tmp_path)
    assert applied["outcome"] == "PASS", applied
    assert Path(applied["numbers"]["module_file"]).is_relative_to(site_packages), applied["numbers"]

    apply_diff(variant.read_diff(), site_packages, reverse=True)
    assert all(file_sha256(site_packages / p) == record[p] for p in copied)


@pytest.mark.slow
@pytest.mark.parametrize("patch_id", TORCH_PATCH_IDS)
def test_probe_reports_stock_torch_as_not_applied(patch_id, torch_catalog, torch_copy, tmp_path):
    site_packages, _ = torch_copy
    patch = torch_catalog[patch_id]
    (variant,) = patch.variants_for(installed_torch_version(site_packages))
    touched = [fp.path for fp in diffengine.parse_patch(variant.read_diff())]

    stock = run_probe_on_overlay(patch.effect_probe, site_packages, touched, False, tmp_path)
    wrongly_patched = run_probe_on_overlay(patch.effect_probe, site_packages, touched, True, tmp_path)
    assert stock["outcome"] == "PASS", stock
    assert wrongly_patched["outcome"] == "FAIL", wrongly_patched


@pytest.mark.slow
def test_sm89_probe_numbers_follow_the_ada_table(torch_catalog, torch_copy, tmp_path):
    site_packages, _ = torch_copy
    (variant,) = torch_catalog["torch/sm89-limits"].variants_for(installed_torch_version(site_packages))
    changed = apply_diff(variant.read_diff(), site_packages)
    result = run_probe_on_overlay("sm89_limits", site_packages, changed, True, tmp_path)
    tflops = result["numbers"]["tflops"]
    # GPULimits: SMs x FMA/clk/SM x 2 x clock; GeForce runs fp16 tensor math at half the data-centre rate.
    assert tflops["RTX 4090 float16 tensor"] == pytest.approx(128 * 256 * 2 * 2.52e9 / 1e12, abs=0.1)
    assert tflops["L40S float16 tensor"] == pytest.approx(142 * 512 * 2 * 2.52e9 / 1e12, abs=0.1)
    assert tflops["RTX 4090 float8_e4m3fn tensor"] == pytest.approx(128 * 1024 * 2 * 2.52e9 / 1e12, abs=0.1)
    assert tflops["RTX 4090 float32 cuda-cores"] == pytest.approx(128 * 128 * 2 * 2.52e9 / 1e12, abs=0.1)


def test_patch_on_already_patched_file_is_reported_not_reapplied(torch_catalog, torch_copy):
    site_packages, _ = torch_copy
    (variant,) = torch_catalog["torch/stream-priority"].variants_for(installed_torch_version(site_packages))
    apply_diff(variant.read_diff(), site_packages)
    (file_patch,) = diffengine.parse_patch(variant.read_diff())
    patched = (site_packages / file_patch.path).read_bytes()
    plan = diffengine.plan_file(file_patch, patched)
    assert plan.new == patched
    assert all(h.state is diffengine.HunkState.APPLIED for h in plan.hunks)


def test_other_release_variant_conflicts_with_installed_torch(torch_catalog, torch_copy):
    site_packages, _ = torch_copy
    old = torch_catalog["torch/stream-priority"].variant("2.4-2.9")
    (file_patch,) = diffengine.parse_patch(old.read_diff())
    with pytest.raises(HunkConflict):
        diffengine.plan_file(file_patch, (site_packages / file_patch.path).read_bytes())


# ------------------------------------------------------------------------------------------- catalog check

def make_toy_patch(root: Path, variants: list[tuple[str, str, str, list[str]]]):
    """A one-file torch patch under root/catalog; variants are (name, specifier, diff text, tested)."""
    folder = root / "catalog" / "torch" / "toy"
    folder.mkdir(parents=True)
    lines = ['title = "toy"', 'summary = "toy"', 'effect_probe = "stream_priority"']
    for name, spec, diff, tested in variants:
        (folder / f"{name}.diff").write_text(diff)
        lines += ["[[variant]]", f'name = "{name}"', f'versions = "{spec}"', f'diff = "{name}.diff"',
                  f"tested = {json.dumps(tested)}"]
    (folder / "patch.toml").write_text("\n".join(lines) + "\n")
    return load_patch(folder, "torch")


TOY_OLD = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"
TOY_NEW = "a = 1\nb = 2\nc = 3\nd = 40\ne = 5\n"   # a later upstream that changed line d
TOY_DIFF_OLD = "--- a/toy.py\n+++ b/toy.py\n@@ -2,3 +2,3 @@\n b = 2\n-c = 3\n+c = 30\n d = 4\n"
TOY_DIFF_NEW = "--- a/toy.py\n+++ b/toy.py\n@@ -2,3 +2,3 @@\n b = 2\n-c = 3\n+c = 30\n d = 40\n"


def make_toy_cache(root: Path, contents: dict[str, str]) -> Path:
    for label, text in contents.items():
        (root / "cache" / "torch" / label).mkdir(parents=True)
        (root / "cache" / "torch" / label / "toy.py").write_text(text)
    return root / "cache"


def test_catalog_check_marks_clean_fails_and_unclaimed_cells(tmp_path):
    patch = make_toy_patch(tmp_path, [("old", "<2.0", TOY_DIFF_OLD, ["1.0"]),
                                      ("new", ">=2.0,<3", TOY_DIFF_NEW, ["2.0", "2.1"])])
    cache = make_toy_cache(tmp_path, {"1.0": TOY_OLD, "1.5": TOY_OLD, "2.0": TOY_NEW, "2.1": TOY_OLD})
    report = check_catalog([patch], cache)
    states = {(row.variant, cell.version): cell.state for row in report.rows for cell in row.cells}
    assert states[("old", "1.0")] is CellState.CLEAN
    assert states[("old", "2.1")] is CellState.UNCLAIMED_APPLIES
    assert states[("new", "2.0")] is CellState.CLEAN
    assert states[("new", "2.1")] is CellState.FAILS
    assert states[("new", "1.0")] is CellState.NOT_APPLICABLE
    assert any("claims 2.1" in p for p in report.problems) and not report.ok
    assert any("2.1" in w and "leave out" in w for w in report.warnings)
    assert any("1.5" in w and "not listed in tested" in w for w in report.warnings)


def test_catalog_check_flags_overlap_and_uncached_tested_versions(tmp_path):
    patch = make_toy_patch(tmp_path, [("old", "<2.1", TOY_DIFF_OLD, ["1.0", "1.9"]),
                                      ("new", ">=2.0", TOY_DIFF_NEW, ["2.0"])])
    cache = make_toy_cache(tmp_path, {"1.0": TOY_OLD, "2.0": TOY_NEW})
    report = check_catalog([patch], cache)
    assert any("all claim 2.0" in p for p in report.problems)
    missing = [c for row in report.rows for c in row.cells if c.state is CellState.CLAIMED_MISSING]
    assert [c.version for c in missing] == ["1.9"]
    assert any("1.9" in p and "not in the cache" in p for p in report.problems)


def test_catalog_check_needs_exactly_one_clean_variant_for_an_unversioned_snapshot(tmp_path):
    patch = make_toy_patch(tmp_path, [("old", "<2.0", TOY_DIFF_OLD, []), ("new", ">=2.0", TOY_DIFF_NEW, [])])
    good = make_toy_cache(tmp_path / "good", {"unversioned-2023-03-22-abc1234": TOY_NEW})
    assert check_catalog([patch], good).ok
    neither = make_toy_cache(tmp_path / "bad", {"unversioned-2022-01-01-def5678": "x = 1\n"})
    report = check_catalog([patch], neither)
    assert any("unversioned-2022-01-01-def5678" in p and "found none" in p for p in report.problems)


def test_catalog_check_of_torch_patches_on_the_installed_release(torch_catalog, tmp_path):
    version = str(Version(installed_torch_version(TORCH_SITE_PACKAGES)).public)
    copy_torch_layout(TORCH_SITE_PACKAGES, tmp_path / "torch" / version)
    report = check_catalog(list(torch_catalog.values()), tmp_path)
    for row in report.rows:
        cell = row.cell(version)
        claimed = torch_catalog[row.patch_id].variant(row.variant).covers(version)
        assert cell.state is (CellState.CLEAN if claimed else CellState.NOT_APPLICABLE), (row, cell)
    # Only the other releases named in `tested` are missing from this one-release cache.
    assert all("not in the cache" in p for p in report.problems), report.problems


@pytest.mark.slow
@pytest.mark.skipif(not (UPSTREAM_CACHE / "torch").is_dir(),
                    reason="no upstream cache (python -m benchmarks upstream torch)")
def test_catalog_check_of_torch_patches_on_every_cached_release(torch_catalog):
    report = check_catalog(list(torch_catalog.values()), UPSTREAM_CACHE)
    assert report.ok, report.problems
    assert not report.warnings, report.warnings


# ------------------------------------------------------------------------------------------ upstream fetcher

def load_fetch_script():
    from benchmarks import fetch_torch
    return fetch_torch


def test_fetcher_keeps_only_the_files_the_catalog_and_detection_need():
    fetch = load_fetch_script()
    kept = ["torch/cuda/streams.py", "torch/cuda/_utils.py", "torch/version.py",
            "torch-2.13.0.dist-info/METADATA", "torch-2.13.0.dist-info/RECORD"]
    dropped = ["torch/cuda/amp/autocast_mode.py", "torch/__init__.py", "torch/lib/libtorch_cpu.dylib",
               "torch-2.13.0.dist-info/WHEEL", "torch/cuda/streams.pyi"]
    assert [m for m in kept + dropped if fetch.wanted(m)] == kept


def test_fetcher_uses_the_macos_platform_tag_of_each_release():
    fetch = load_fetch_script()
    assert fetch.platform_tag("2.4.1") == fetch.platform_tag("2.11.0") == "macosx_11_0_arm64"
    assert fetch.platform_tag("2.12.0") == fetch.platform_tag("2.15.0") == "macosx_14_0_arm64"
