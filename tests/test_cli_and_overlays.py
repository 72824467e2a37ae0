"""The CLI surface (help, version, explain, refresh) and overlay install/uninstall by manifest."""
from __future__ import annotations

import subprocess
import sys

import pytest

from applier import __version__
from applier.catalog import load_catalog
from applier.catalog.allowlist import install_for
from applier.catalog.packmeta import read_pack
from applier.cli import cli
from applier.detect import detect
from applier.errors import DriftError, RefusedError
from applier.pack import overlays
from applier.pack.overlays import listing
from shelltools import REPO, cli_json, make_comfy, make_torch_env, run_cli, tree_bytes, write_patch


def install(target, pack_dir):
    """`applier overlay install` as the command runs it: the install opened for a run with the pack's folders."""
    meta = read_pack(pack_dir)
    with install_for(target, load_catalog(), overlays.prefixes(target, meta), run=True) as opened:
        return overlays.install(opened, pack_dir, meta)


def uninstall(target, *, force=False):
    """`applier overlay uninstall` as the command runs it (nothing created where no state folder exists)."""
    with install_for(target, load_catalog(), overlays.prefixes(target), run=True, create=False) as opened:
        return overlays.uninstall(opened, force=force)


def test_help_lists_the_commands_and_version_works():
    proc = run_cli("--help", check=True)
    for command in ("detect", "list", "apply", "revert", "status", "verify", "explain", "overlay", "catalog"):
        assert f"  {command}" in proc.stdout
    assert run_cli("--version", check=True).stdout.strip() == f"applier, version {__version__}"
    proc = subprocess.run([sys.executable, "-m", "applier", "--version"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and __version__ in proc.stdout


def test_usage_errors_keep_click_exit_2():
    assert run_cli("apply").returncode == 2                      # --target missing
    assert run_cli("apply", "--target", ".", "--fuzz", "9").returncode == 2


def complete(**env: str) -> subprocess.CompletedProcess:
    """Run the `applier` entry point as the console script does (argv[0] ends in applier) with Click's completion
    variables set, as the shell function it generates calls it."""
    script = "import sys; from applier.cli import main; sys.argv[0] = 'applier'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env})


def completions(words: str) -> list[str]:
    """The values bash would offer after `words` (the last word being completed; "" after a space)."""
    parts = words.split(" ")
    proc = complete(_APPLIER_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("plain,") for line in lines), proc.stdout
    return [line.split(",", 1)[1] for line in lines]


def test_shell_completion_script_is_generated():
    proc = complete(_APPLIER_COMPLETE="bash_source")
    assert proc.returncode == 0, proc.stderr
    assert "_applier_completion()" in proc.stdout
    assert "complete -o nosort -F _applier_completion applier" in proc.stdout
    assert "_APPLIER_COMPLETE=bash_complete" in proc.stdout


def test_shell_completion_offers_the_subcommands_and_patch_ids():
    offered = completions("applier ")
    assert offered == sorted(cli.commands)          # every subcommand, and nothing else
    assert {"detect", "list", "apply", "status", "verify", "revert", "explain", "overlay", "catalog"} <= set(offered)
    assert completions("applier rev") == ["revert"]
    comfy_ids = sorted(p.id for p in load_catalog() if p.id.startswith("comfyui/"))
    assert comfy_ids and sorted(completions("applier explain comfyui/")) == comfy_ids
    assert "--only" in completions("applier apply --o")


def test_explain_states_reach_and_how_to_revert():
    catalog = load_catalog()
    assert catalog, "the packaged catalog loaded empty"
    for patch in catalog:
        code, out = cli_json("explain", patch.id)
        assert code == 0
        assert out["reach"], f"{patch.id} says nothing about whom it reaches"
        assert out["revert"] == f"applier revert --target <TARGET> --only {patch.id}"
        assert out["variants"]
    proc = run_cli("explain", "nope/nope")
    assert proc.returncode == 3 and "no patch" in proc.stderr  # an unknown id is exit 3 in every command


def test_catalog_refresh_builds_a_variant_that_round_trips(tmp_path):
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/maxres", [("old", "<0.3", "--- a/nodes.py\n+++ b/nodes.py\n@@ -1 +1 @@\n-a\n+b\n")])
    upstream = tmp_path / "nodes.py"
    upstream.write_bytes(b"import os\r\n\r\nMAX_RESOLUTION=16384\r\nx = 1")       # CRLF, no final newline
    edited = tmp_path / "edited.py"
    edited.write_bytes(b"import os\r\n\r\nMAX_RESOLUTION=40960\r\nx = 1")
    proc = run_cli("catalog", "refresh", "comfyui/maxres", "--upstream", str(upstream), "--edited", str(edited),
                   "--path", "nodes.py", "--versions", ">=0.4", "--name", "0.4", "--patches", str(catalog))
    assert proc.returncode == 0, proc.stderr
    patch = load_catalog(catalog)[0]
    assert [v.name for v in patch.variants] == ["old", "0.4"]
    comfy = make_comfy(tmp_path / "t", version="0.4.1")
    (comfy / "nodes.py").write_bytes(upstream.read_bytes())
    run_cli("apply", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (comfy / "nodes.py").read_bytes() == edited.read_bytes()
    run_cli("revert", "--target", str(comfy), "--patches", str(catalog), check=True)
    assert (comfy / "nodes.py").read_bytes() == upstream.read_bytes()


def test_catalog_refresh_refuses_identical_files(tmp_path):
    catalog = tmp_path / "catalog"
    write_patch(catalog, "comfyui/x", [("old", "<0.3", "--- a/n.py\n+++ b/n.py\n@@ -1 +1 @@\n-a\n+b\n")])
    same = tmp_path / "n.py"
    same.write_text("a\n")
    proc = run_cli("catalog", "refresh", "comfyui/x", "--upstream", str(same), "--edited", str(same), "--path",
                   "n.py", "--versions", ">=1", "--name", "1", "--patches", str(catalog))
    assert proc.returncode == 3 and "identical" in proc.stderr


def make_pack(root):
    pack = root / "pack"
    (pack / "demo_pkg" / "ops").mkdir(parents=True)
    (pack / "demo_pkg" / "__init__.py").write_text("VERSION = 1\n")
    (pack / "demo_pkg" / "ops" / "k.py").write_text("def k(): return 1\n")
    (pack / "demo_node").mkdir()
    (pack / "demo_node" / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (pack / "pack.toml").write_text('name = "demo"\nversion = "1.0"\npackage = "demo_pkg"\nnode = "demo_node"\n')
    return pack


@pytest.fixture
def overlay_target(tmp_path):
    comfy = make_comfy(tmp_path)
    env, site = make_torch_env(comfy)     # ComfyUI/venv
    return detect(comfy, gpu=False), site


def test_overlay_install_then_uninstall_removes_exactly_its_files(overlay_target, tmp_path):
    target, site = overlay_target
    pack = make_pack(tmp_path)
    before_site, before_comfy = tree_bytes(site), tree_bytes(target.comfyui_root)
    result = install(target, pack)
    assert (site / "demo_pkg" / "ops" / "k.py").exists()
    assert (target.comfyui_root / "custom_nodes" / "demo_node" / "__init__.py").exists()
    assert len(result["files"]) == 3
    assert listing(target)["intact"] == 3
    # a file the user put into the installed folder is not ours: uninstall leaves it
    (site / "demo_pkg" / "mine.txt").write_text("keep me")
    uninstall(target)
    assert (site / "demo_pkg" / "mine.txt").read_text() == "keep me"
    (site / "demo_pkg" / "mine.txt").unlink()
    (site / "demo_pkg").rmdir()
    assert tree_bytes(site) == before_site
    assert tree_bytes(target.comfyui_root) == before_comfy
    assert listing(target) == {"installed": False}


def test_overlay_install_never_overwrites_a_foreign_file(overlay_target, tmp_path):
    target, site = overlay_target
    (site / "demo_pkg").mkdir()
    (site / "demo_pkg" / "__init__.py").write_text("somebody else's package\n")
    with pytest.raises(RefusedError, match="not installed by applier"):
        install(target, make_pack(tmp_path))
    assert (site / "demo_pkg" / "__init__.py").read_text() == "somebody else's package\n"
    assert not (site / "demo_pkg" / "ops").exists()


def test_overlay_uninstall_refuses_edited_files_unless_forced(overlay_target, tmp_path):
    target, site = overlay_target
    install(target, make_pack(tmp_path))
    edited = site / "demo_pkg" / "ops" / "k.py"
    edited.write_text("def k(): return 2  # my fix\n")
    with pytest.raises(DriftError):
        uninstall(target)
    assert edited.exists()
    result = uninstall(target, force=True)
    assert not edited.exists()
    saved = list((target.state_dir / "displaced").rglob("k.py"))
    assert saved and saved[0].read_text() == "def k(): return 2  # my fix\n"
    assert result["displaced"]


def test_the_shipped_pack_installs_imports_and_uninstalls_through_the_cli(tmp_path):
    comfy = make_comfy(tmp_path)
    env, site = make_torch_env(comfy)
    before = tree_bytes(comfy)
    code, out = cli_json("overlay", "install", "--target", str(comfy))
    assert code == 0, out
    assert (site / "fused_dit" / "__init__.py").is_file()
    assert (comfy / "custom_nodes" / "comfyui_fused_dit" / "__init__.py").is_file()
    code, listed = cli_json("overlay", "list", "--target", str(comfy))
    assert listed["installed"] and listed["modified"] == 0 and listed["missing"] == 0
    # the installed copy is the one the target's interpreter imports (isolated mode, as ComfyUI would)
    proc = subprocess.run([str(env / "bin" / "python"), "-I", "-c",
                           "import importlib.util; print(importlib.util.find_spec('fused_dit').origin)"],
                          capture_output=True, text=True)
    assert proc.stdout.strip() == str(site / "fused_dit" / "__init__.py")
    code, out = cli_json("overlay", "uninstall", "--target", str(comfy))
    assert code == 0, out
    assert not (site / "fused_dit").exists() and not (comfy / "custom_nodes" / "comfyui_fused_dit").exists()
    assert tree_bytes(comfy) == before


def test_a_missing_or_malformed_catalog_is_refused_with_exit_3(tmp_path):
    comfy = make_comfy(tmp_path)
    proc = run_cli("list", "--target", str(comfy), "--patches", str(tmp_path / "nope"))
    assert proc.returncode == 3 and "does not exist" in proc.stderr
    bad = tmp_path / "bad" / "comfyui" / "x"
    bad.mkdir(parents=True)
    (bad / "patch.toml").write_text("title = [\n")
    before = tree_bytes(comfy)
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(tmp_path / "bad"))
    assert proc.returncode == 3 and "patch.toml" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_bytes(comfy) == before
