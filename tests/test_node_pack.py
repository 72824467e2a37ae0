"""The node pack installed the ComfyUI way: `applier overlay export` writes one self-contained folder, which a
ComfyUI-shaped tree loads as ComfyUI's loader loads a custom node; both install routes give the same node; status,
overlay check and overlay list recognise a pack that applier did not install."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from applier.catalog.packmeta import read_pack
from applier.errors import RefusedError
from applier.pack.node_pack import export, registry_metadata, standalone_files
from shelltools import REPO, cli_json, make_comfy, make_torch_env, run_cli
from tests.fixtures.comfy_tree import build_comfy_tree

# What ComfyUI's nodes.load_custom_node does with a folder under custom_nodes/ (0.33.0): the folder's __init__.py
# through spec_from_file_location, under the folder's path with "." replaced by "_x_", registered in sys.modules
# first. Then what the node offers, and where its kernels package comes from.
LOADER = """
import importlib.util, json, os, sys
path = sys.argv[1]
name = path.replace(".", "_x_")
spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"))
module = importlib.util.module_from_spec(spec)
sys.modules[name] = module
spec.loader.exec_module(module)
nodes = {key: {"class": cls.__name__, "returns": list(cls.RETURN_TYPES),
               "inputs": {group: sorted(names) for group, names in cls.INPUT_TYPES().items()}}
         for key, cls in module.NODE_CLASS_MAPPINGS.items()}
import fused_dit, fused_dit.variants
print(json.dumps({"nodes": nodes, "display": module.NODE_DISPLAY_NAME_MAPPINGS, "package": fused_dit.__file__,
                  "submodule": fused_dit.variants.__file__}))
"""
# ComfyUI-Manager's "Install via Git URL" clones into custom_nodes/<repository name>
MANAGER_FOLDER = "ComfyUI-fused-dit"


def load_like_comfyui(folder: Path, python: str = sys.executable) -> dict:
    """LOADER in a fresh interpreter in isolated mode (no PYTHONPATH, not started from this repository)."""
    proc = subprocess.run([python, "-I", "-c", LOADER, str(folder)], capture_output=True, text=True,
                          cwd=folder.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def comfy_with_code(root: Path, **kw) -> Path:
    """A ComfyUI-shaped tree with the two files `overlay check` looks for."""
    comfy = build_comfy_tree(root / "ComfyUI", layout="plain", **kw)
    (comfy / "comfy" / "model_base.py").write_text("class BaseModel:\n    pass\n")
    (comfy / "comfy" / "ops.py").write_text("class disable_weight_init:\n    pass\n")
    return comfy


def test_pack_toml_the_registry_metadata_and_the_package_agree_on_the_version():
    meta = read_pack()
    init = (REPO / "overlays" / meta["package"] / "__init__.py").read_text()
    registry = registry_metadata()
    assert registry["project"]["version"] == meta["version"]
    assert re.search(r'^__version__ = "(.+)"$', init, re.M).group(1) == meta["version"]
    assert registry["project"]["dependencies"] == []        # no pip step beyond what ComfyUI has
    assert "comfyui" not in registry["project"]["name"].lower()   # the registry's naming rule
    assert set(registry["tool"]["comfy"]) >= {"PublisherId", "DisplayName", "Icon"}


def test_the_exported_folder_loads_in_a_comfyui_tree_with_its_own_kernels_package(tmp_path):
    exported = export(tmp_path / "export", publisher="someone", repository="https://example.invalid/fused-dit")
    comfy = build_comfy_tree(tmp_path / "ComfyUI", layout="plain")
    folder = comfy / "custom_nodes" / MANAGER_FOLDER
    shutil.copytree(exported["folder"], folder)
    loaded = load_like_comfyui(folder)
    assert list(loaded["nodes"]) == ["FusedDiTOps", "TiledSampling", "TiledVAEDecode", "TiledVAEEncode",
                                     "SaveImagePNG"]
    assert loaded["nodes"]["FusedDiTOps"]["returns"] == ["MODEL"]
    assert loaded["nodes"]["TiledSampling"]["returns"] == ["MODEL"]
    assert loaded["display"] == {"FusedDiTOps": "Fused DiT Ops (Triton)", "TiledSampling": "Tiled Sampling",
                                 "TiledVAEDecode": "VAE Decode (Tiled, one pass)",
                                 "TiledVAEEncode": "VAE Encode (Tiled, one pass)",
                                 "SaveImagePNG": "Save Image (PNG on every core)"}
    # ComfyUI lists a node pack's example_workflows/ as templates: the 32K route travels with the node
    assert (folder / "example_workflows" / "make_a_32k_image_flux.json").is_file()
    # the interpreter has no fused_dit of its own: the node found the copy it carries, submodules included
    assert Path(loaded["package"]) == folder / "fused_dit" / "__init__.py"
    assert Path(loaded["submodule"]) == folder / "fused_dit" / "variants.py"
    pyproject = (folder / "pyproject.toml").read_text()
    assert 'PublisherId = "someone"' in pyproject and 'Repository = "https://example.invalid/fused-dit"' in pyproject


def test_both_routes_give_the_same_node_from_the_same_bytes(tmp_path):
    comfy = make_comfy(tmp_path)
    env, site = make_torch_env(comfy)
    code, out = cli_json("overlay", "install", "--target", str(comfy))
    assert code == 0, out
    managed = comfy / "custom_nodes" / "comfyui_fused_dit"
    exported = Path(export(tmp_path / "export")["folder"])
    package = read_pack()["package"]
    for rel, data in standalone_files().items():
        installed = site / rel if rel.startswith(package + "/") else managed / rel
        assert installed.read_bytes() == data == (exported / rel).read_bytes(), rel
    through_applier = load_like_comfyui(managed, str(env / "bin" / "python"))
    assert Path(through_applier["package"]) == site / package / "__init__.py"
    by_git = comfy / "custom_nodes" / MANAGER_FOLDER
    shutil.copytree(exported, by_git)
    assert load_like_comfyui(by_git)["nodes"] == through_applier["nodes"]


def test_export_refuses_a_folder_of_other_files_and_updates_an_earlier_export_in_place(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    with pytest.raises(RefusedError, match="holds other files"):
        export(other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    clone = tmp_path / "clone"
    export(clone)
    (clone / ".git").mkdir()
    stale = clone / read_pack()["package"] / "retired_op.py"
    stale.write_text("old\n")
    result = export(clone)
    assert not stale.exists() and (clone / ".git").is_dir()
    assert result["removed"] == [f"{read_pack()['package']}/retired_op.py"]


@pytest.mark.parametrize("option,value", [
    ("--publisher", "bad id with spaces"), ("--publisher", "Me"), ("--publisher", "1st"), ("--publisher", ""),
    ("--repository", "javascript:alert(1)"), ("--repository", "github.com/me/fused-dit"),
    ("--repository", "https://"), ("--repository", 'https://github.com/me/x"\nmalicious = 1'),
    ("--repository", "https://[::1/x")])
def test_export_refuses_what_the_comfy_registry_refuses_as_a_usage_error_before_writing(tmp_path, option, value):
    dest = tmp_path / "export"
    proc = run_cli("overlay", "export", str(dest), option, value)
    assert proc.returncode == 2, proc.stderr
    assert f"Invalid value for '{option}'" in proc.stderr
    assert not dest.exists()
    with pytest.raises(RefusedError):
        export(dest, **{option.lstrip("-"): value})
    assert not dest.exists()


def test_export_fills_a_publisher_id_and_a_repository_the_registry_accepts(tmp_path):
    export(tmp_path / "export", publisher="me-2", repository="https://github.com/me/fused-dit")
    text = (tmp_path / "export" / "pyproject.toml").read_text()
    assert 'PublisherId = "me-2"' in text and 'Repository = "https://github.com/me/fused-dit"' in text


def test_status_and_overlay_check_recognise_a_pack_installed_from_a_git_url(tmp_path):
    comfy = comfy_with_code(tmp_path)
    code, status = cli_json("status", "--target", str(comfy))
    assert code == 0 and status["node_pack"] == []
    folder = comfy / "custom_nodes" / MANAGER_FOLDER
    export(folder)
    (folder / ".git").mkdir()                       # a clone, as ComfyUI-Manager's "Install via Git URL" leaves it
    code, status = cli_json("status", "--target", str(comfy))
    assert code == 0, status                        # a pack installed by hand is not drift
    [found] = status["node_pack"]
    assert found["folder"] == str(folder) and found["installed_by"] == "git"
    assert found["carries_package"] and found["finds_package"] and found["same_as_this_applier"]
    assert found["version"] == read_pack()["version"] and not found["disabled"]
    code, report = cli_json("overlay", "check", "--target", str(comfy))
    assert code == 0 and report["node_pack"] == [found] and report["node_pack_note"] is None
    text = run_cli("overlay", "list", "--target", str(comfy), check=True).stdout
    assert "no overlay installed by applier" in text and "installed from a git URL" in text


def test_status_tells_registry_installs_other_versions_and_two_loaded_copies_apart(tmp_path):
    comfy = comfy_with_code(tmp_path)
    make_torch_env(comfy)
    registry = comfy / "custom_nodes" / "fused-dit"
    export(registry)
    (registry / ".tracking").write_text("__init__.py\n")    # ComfyUI-Manager's mark of a Comfy Registry install
    init = registry / "__init__.py"
    init.write_text(init.read_text() + "# another release\n")
    text = run_cli("status", "--target", str(comfy), check=True).stdout
    assert "installed from the Comfy Registry" in text and "other files than this applier's pack" in text
    code, report = cli_json("overlay", "check", "--target", str(comfy))
    assert str(registry) in report["node_pack_note"] and "its own fused_dit/variants.json" in report["node_pack_note"]
    code, refused = cli_json("overlay", "install", "--target", str(comfy))     # a second copy: refused
    assert code == 3 and str(registry) in refused["error"]["message"]
    clone = comfy / "custom_nodes" / "ComfyUI-fused-dit"
    export(clone)
    (clone / ".git").mkdir()
    code, status = cli_json("status", "--target", str(comfy))
    by = {Path(i["folder"]).name: i["installed_by"] for i in status["node_pack"]}
    assert by == {"ComfyUI-fused-dit": "git", "fused-dit": "registry"}
    assert "ComfyUI loads 2 copies of the same node" in run_cli("status", "--target", str(comfy), check=True).stdout
    shutil.rmtree(clone)
    registry.rename(registry.with_name("fused-dit.disabled"))
    text = run_cli("status", "--target", str(comfy), check=True).stdout
    assert "disabled: ComfyUI does not load it" in text and "copies of the same node" not in text


def test_a_copied_node_without_its_package_is_said_to_fail_when_it_runs(tmp_path):
    comfy = comfy_with_code(tmp_path)
    node = comfy / "custom_nodes" / "comfyui_fused_dit"
    shutil.copytree(REPO / "overlays" / "comfyui_fused_dit", node, ignore=shutil.ignore_patterns("__pycache__"))
    code, status = cli_json("status", "--target", str(comfy))
    [found] = status["node_pack"]
    assert found["installed_by"] == "copied" and not found["carries_package"] and not found["finds_package"]
    assert "the node fails when it runs" in run_cli("status", "--target", str(comfy), check=True).stdout


def test_export_into_an_earlier_clone_never_writes_through_a_link_out(tmp_path):
    from applier.store.fileops import LeadsOutside
    dest = tmp_path / "clone"
    export(dest)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.py").write_text("mine = 1\n")
    shutil.rmtree(dest / "fused_dit")
    (dest / "fused_dit").symlink_to(outside, target_is_directory=True)     # planted in the clone
    with pytest.raises(LeadsOutside):
        export(dest)
    assert sorted(p.name for p in outside.iterdir()) == ["keep.py"]
    assert (outside / "keep.py").read_text() == "mine = 1\n"


def test_the_exported_pack_carries_a_readme_of_its_nodes_and_the_projects_license(tmp_path):
    exported = export(tmp_path / "export")
    folder = Path(exported["folder"])
    assert {"README.md", "LICENSE"} <= set(exported["files"])
    assert (folder / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()
    readme = (folder / "README.md").read_text(encoding="utf-8")
    for shown in ("Fused DiT Ops (Triton)", "Tiled Sampling"):      # the two nodes, by the names ComfyUI shows
        assert f"**{shown}**" in readme, shown
    templates = sorted((folder / "example_workflows").glob("*.json"))
    assert templates and all(f"example_workflows/{t.name}" in readme for t in templates)
    cited = set(re.findall(r"`([\w.-]+\.json)`", readme)) - {f"example_workflows/{t.name}" for t in templates}
    assert "benchmarks/results/" in readme and cited
    assert all((REPO / "benchmarks" / "results" / name).is_file() for name in cited), cited


def test_the_repository_carries_the_mit_license_that_setup_cfg_declares():
    import configparser
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert config["metadata"]["license"] == "MIT" and text.startswith("MIT License")
    assert "Copyright (c) " in text and "the applier authors" in text
    assert "LICENSE" in (REPO / "MANIFEST.in").read_text(encoding="utf-8").split()
