"""What the catalog's data decides at plan time: shared diffs, requirements between a patch and the target, releases
newer than every variant's range, the advice for a lost patch no variant fits, and paths into applier's own state."""
from __future__ import annotations

from pathlib import Path

import pytest

from applier.catalog import load_catalog
from applier.catalog.planner import clear_record_command, load_file_patches, plan_apply, plan_patch, reapply_plan
from applier.detect import detect
from applier.errors import EXIT_REFUSED, NoVariantError, RefusedError, UnsafePathError
from tests.shelltools import EXEC_DIFF, MAXRES_DIFF, cli_json, make_comfy, run_cli, tree_bytes, write_patch

HELPER_DIFF = """\
--- /dev/null
+++ b/helper_module.py
@@ -0,0 +1,2 @@
+# created by the test patch
+VALUE = 1
"""
PIL_LIKE_DIFF = """\
--- a/nodes.py
+++ b/nodes.py
@@ -1,2 +1,3 @@
 import os
+LIMIT = MAX_RESOLUTION * MAX_RESOLUTION
 
"""
REQUIRES_MAXRES = '[[requires_text]]\nfile = "nodes.py"\npattern = \'^MAX_RESOLUTION\\s*=\'\nwhy = "it reads it"\n'


def add_lines(folder: Path, text: str) -> None:
    """Top-level keys go first; a [[table]] goes last (anything after its header would belong to it)."""
    toml = folder / "patch.toml"
    toml.write_text(toml.read_text() + "\n" + text if text.startswith("[[") else text + toml.read_text())


def shared_catalog(tmp_path: Path) -> Path:
    catalog = tmp_path / "catalog"
    folder = write_patch(catalog, "comfyui/exec", [("old", "<0.3.50", EXEC_DIFF), ("new", ">=0.3.50,<0.4", EXEC_DIFF)])
    (folder / "helper.diff").write_text(HELPER_DIFF)
    add_lines(folder, 'shared = ["helper.diff"]\n')
    return catalog


# ----------------------------------------------------------------------------------------------- shared diffs

def test_a_shared_diff_is_part_of_every_variant(tmp_path):
    (patch,) = load_catalog(shared_catalog(tmp_path))
    for variant in patch.variants:
        assert [fp.path for fp in load_file_patches(patch, variant)] == ["helper_module.py", "execution.py"]


def test_apply_status_revert_cover_the_shared_file(tmp_path):
    comfy = make_comfy(tmp_path, version="0.3.60")
    catalog = shared_catalog(tmp_path)
    before = tree_bytes(comfy)
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert (comfy / "helper_module.py").read_text() == "# created by the test patch\nVALUE = 1\n"
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    (comfy / "helper_module.py").write_text("VALUE = 2\n")          # the shared file edited by hand: drift
    code, out = cli_json("status", "--target", str(comfy), "--patches", str(catalog))
    assert code == 5, out
    (comfy / "helper_module.py").write_text("# created by the test patch\nVALUE = 1\n")
    code, out = cli_json("revert", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    assert tree_bytes(comfy) == before


def test_a_shared_diff_and_a_variant_touching_one_file_are_refused(tmp_path):
    catalog = tmp_path / "catalog"
    folder = write_patch(catalog, "comfyui/exec", [("all", ">=0", EXEC_DIFF)])
    (folder / "helper.diff").write_text(EXEC_DIFF.replace("retried once", "again"))
    add_lines(folder, 'shared = ["helper.diff"]\n')
    (patch,) = load_catalog(catalog)
    with pytest.raises(RefusedError, match="two sections"):
        load_file_patches(patch, patch.variants[0])


# ----------------------------------------------------------------------------------------- the catalog is data

@pytest.mark.parametrize("path", [".applier/state.json", "sub/.applier/x", ".Applier/journal.json"])
def test_a_diff_into_applier_state_is_refused_before_anything_is_read(tmp_path, path):
    comfy = make_comfy(tmp_path)
    catalog = tmp_path / "catalog"
    evil = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{{}}\n"
    write_patch(catalog, "comfyui/evil", [("all", ">=0", evil)])
    (patch,) = load_catalog(catalog)
    with pytest.raises(UnsafePathError, match="applier's own"):
        load_file_patches(patch, patch.variants[0])
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/evil")
    assert proc.returncode == EXIT_REFUSED and "Traceback" not in proc.stderr
    assert tree_bytes(comfy) == before and not (comfy / ".applier" / "state.json").exists()


# ----------------------------------------------------------------------------------------------- requirements

def requiring_catalog(tmp_path: Path) -> Path:
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/maxres", [("all", ">=0", MAXRES_DIFF)])
    add_lines(write_patch(catalog, "comfyui/pil", [("all", ">=0", PIL_LIKE_DIFF)]), REQUIRES_MAXRES)
    return catalog


def without_max_resolution(comfy: Path) -> None:
    nodes = comfy / "nodes.py"
    nodes.write_text(nodes.read_text().replace("MAX_RESOLUTION=16384\n", "").replace("MAX_RESOLUTION", "8192"))


def test_an_unmet_text_requirement_named_with_only_is_refused_and_changes_nothing(tmp_path):
    comfy = make_comfy(tmp_path)
    without_max_resolution(comfy)
    catalog = requiring_catalog(tmp_path)
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/pil")
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert "nodes.py has no line matching" in proc.stderr and "it reads it" in proc.stderr
    assert tree_bytes(comfy) == before


def test_an_unmet_text_requirement_in_the_default_selection_is_not_applicable(tmp_path):
    comfy = make_comfy(tmp_path)
    without_max_resolution(comfy)
    catalog = requiring_catalog(tmp_path)
    # (maxres itself cannot apply to this tree; skipped, the default selection is what is tested)
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog), "--dry-run",
                         "--skip", "comfyui/maxres")
    assert code == 0, out
    plans = {p["id"]: p for p in out["patches"]}
    assert plans["comfyui/pil"]["action"] == "not-applicable"
    assert "MAX_RESOLUTION" in plans["comfyui/pil"]["reason"]


def test_a_met_requirement_applies(tmp_path):
    comfy = make_comfy(tmp_path)
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(requiring_catalog(tmp_path)),
                         "--only", "comfyui/pil")
    assert code == 0, out
    assert b"LIMIT = MAX_RESOLUTION" in (comfy / "nodes.py").read_bytes()


def test_text_requirements_see_what_earlier_patches_of_the_run_will_write(tmp_path):
    comfy = make_comfy(tmp_path)
    without_max_resolution(comfy)
    catalog = tmp_path / "catalog"
    adds = "--- a/nodes.py\n+++ b/nodes.py\n@@ -1,2 +1,3 @@\n import os\n+MAX_RESOLUTION=1\n \n"
    write_patch(catalog, "comfyui/a-define", [("all", ">=0", adds)])
    add_lines(write_patch(catalog, "comfyui/b-use", [("all", ">=0", "--- a/execution.py\n+++ b/execution.py\n"
                                                     "@@ -1,2 +1,3 @@\n def execute(node):\n+    pass\n"
                                                     "     return node()\n")]), REQUIRES_MAXRES)
    patches = load_catalog(catalog)
    target = detect(comfy, gpu=False)
    assert [p.action for p in plan_apply(target, patches, explicit=True)] == ["apply", "apply"]
    with pytest.raises(RefusedError, match="MAX_RESOLUTION"):
        plan_apply(target, [patches[1]], explicit=True)


def test_a_required_patch_must_be_in_the_run_or_applied_already(tmp_path):
    comfy = make_comfy(tmp_path)
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/a-maxres", [("all", ">=0", MAXRES_DIFF)])
    add_lines(write_patch(catalog, "comfyui/b-exec", [("all", ">=0", EXEC_DIFF)]), 'requires = ["comfyui/a-maxres"]\n')
    maxres, exec_patch = load_catalog(catalog)
    assert exec_patch.required == (maxres,)
    target = detect(comfy, gpu=False)
    with pytest.raises(RefusedError, match="needs comfyui/a-maxres"):
        plan_apply(target, [exec_patch], explicit=True)
    assert [p.action for p in plan_apply(target, [maxres, exec_patch], explicit=True)] == ["apply", "apply"]
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), "--only", "comfyui/a-maxres", check=True)
    assert plan_apply(detect(comfy, gpu=False), [exec_patch], explicit=True)[0].action == "apply"


# ------------------------------------------------------------------------------------ releases past the catalog

def test_a_release_newer_than_every_range_takes_the_one_clean_variant_and_says_so(tmp_path):
    comfy = make_comfy(tmp_path, version="0.4.2")
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/exec", [("old", "<0.3.50", "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"),
                                          ("new", ">=0.3.50,<0.4", EXEC_DIFF)])
    code, out = cli_json("apply", "--target", str(comfy), "--patches", str(catalog))
    assert code == 0, out
    (plan,) = out["patches"]
    assert plan["variant"] == "new" and plan["action"] == "apply"
    assert plan["reason"] == ("comfyui 0.4.2 is outside every variant's range; "
                              "variant new applies cleanly (dry run)")


def test_a_release_newer_than_every_range_that_no_variant_fits_is_refused_by_name(tmp_path):
    comfy = make_comfy(tmp_path, version="0.4.2")
    (comfy / "execution.py").write_text("def execute(node):\n    return node(retry=True)\n")
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/exec", [("new", ">=0.3.50,<0.4", EXEC_DIFF)])
    (patch,) = load_catalog(catalog)
    target = detect(comfy, gpu=False)
    assert plan_patch(target, patch).action == "not-applicable"
    with pytest.raises(NoVariantError) as caught:
        plan_patch(target, patch, explicit=True)
    assert "newer than every variant's range" in caught.value.message and "newer applier" in caught.value.hint


def test_reapply_plan_gives_the_command_that_clears_a_lost_patch_no_variant_fits(tmp_path):
    comfy = make_comfy(tmp_path, version="0.4.2")
    (comfy / "execution.py").write_text("def execute(node):\n    return node(retry=True)\n")
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/exec", [("new", ">=0.3.50,<0.4", EXEC_DIFF)])
    (patch,) = load_catalog(catalog)
    target = detect(comfy, gpu=False)
    with pytest.raises(NoVariantError) as caught:
        reapply_plan(target, patch)
    assert caught.value.exit_code == EXIT_REFUSED
    clear = f"applier revert --target {target.root} --only comfyui/exec --forget"
    assert clear_record_command(target, "comfyui/exec") == clear
    assert clear in caught.value.hint and "newer applier" in caught.value.hint
    assert "comfyui 0.4.2" in caught.value.message


def test_reapply_plan_re_plans_a_lost_patch_that_a_variant_fits(tmp_path):
    comfy = make_comfy(tmp_path, version="0.3.60")
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/exec", [("new", ">=0.3.50,<0.4", EXEC_DIFF)])
    (patch,) = load_catalog(catalog)
    plan = reapply_plan(detect(comfy, gpu=False), patch)
    assert plan.action == "apply" and plan.variant.name == "new" and plan.changes
