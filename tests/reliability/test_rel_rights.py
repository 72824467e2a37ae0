"""Reliability round 3 (issue 32), the smaller breaks of the file layer: saved edits never overwritten, copies no
more readable than their originals, access rights kept through apply and revert, a deep `.applier/` a clear
refusal, a foreign folder of the pack's name never merged into or pruned."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from applier.store.heldroot import HeldRoot
from reltools import assert_clean, cli, make_install, snapshot

pytestmark = pytest.mark.slow


def edit(path, text: str) -> None:
    """An edit inside the patched region: only `revert --force` restores the original, saving this first."""
    path.write_text(path.read_text().replace("MAX_RESOLUTION=40960", f"MAX_RESOLUTION=50000  {text.strip()}"))


def test_two_forced_reverts_in_one_second_never_share_a_displaced_folder(tmp_path, monkeypatch):
    import time
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261202-120000")     # the same second, always
    inst = make_install(tmp_path / "t", layout="plain")
    saved = []
    for n in range(2):
        assert_clean(cli(*inst.args("apply")), allowed=(0,))
        edit(inst.root / "nodes.py", f"# my edit {n}\n")
        assert_clean(cli(*inst.args("revert", "--force")), allowed=(0,))
    displaced = inst.root / ".applier" / "displaced"
    folders = sorted(p.name for p in displaced.iterdir())
    assert folders == ["20261202-120000", "20261202-120000-2"]
    for n, folder in enumerate(folders):
        saved.append((displaced / folder / "comfyui" / "nodes.py").read_text())
        assert f"# my edit {n}" in saved[-1], "an earlier saved edit was overwritten"


def test_backups_and_displaced_copies_are_no_more_readable_than_their_original(tmp_path):
    inst = make_install(tmp_path / "t", layout="plain")
    os.chmod(inst.root / "nodes.py", 0o600)
    (inst.root / ".applier").mkdir(mode=0o755)
    assert_clean(cli(*inst.args("apply")), allowed=(0,))
    state = inst.root / ".applier"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    backup = next(state.glob("backups/*/*/comfyui/nodes.py"))
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE((state / "state.json").stat().st_mode) & 0o077 == 0
    edit(inst.root / "nodes.py", "# private edit\n")
    assert_clean(cli(*inst.args("revert", "--force")), allowed=(0,))
    saved = next(state.glob("displaced/*/comfyui/nodes.py"))
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE((inst.root / "nodes.py").stat().st_mode) == 0o600


def xattrs_work(path) -> bool:
    try:
        os.setxattr(path, "user.applier-test", b"1")
        os.removexattr(path, "user.applier-test")
        return True
    except (OSError, AttributeError):
        return False


def test_mode_bits_and_extended_attributes_survive_apply_and_revert(tmp_path):
    inst = make_install(tmp_path / "t", layout="plain")
    nodes = inst.root / "nodes.py"
    os.chmod(nodes, 0o6754)     # setuid and setgid, as an odd install may have
    has_xattrs = xattrs_work(nodes)
    if has_xattrs:
        os.setxattr(nodes, "user.origin", b"hand-installed")
    has_acl = shutil.which("setfacl") is not None and shutil.which("getfacl") is not None and \
        subprocess.run(["setfacl", "-m", "u:nobody:r", str(nodes)], capture_output=True).returncode == 0
    before_acl = subprocess.run(["getfacl", "-c", str(nodes)], capture_output=True, text=True).stdout \
        if has_acl else None
    mode_before = stat.S_IMODE(nodes.stat().st_mode)
    for command in ("apply", "revert"):
        assert_clean(cli(*inst.args(command)), allowed=(0,))
        assert stat.S_IMODE(nodes.stat().st_mode) == mode_before, command
        if has_xattrs:
            assert os.getxattr(nodes, "user.origin") == b"hand-installed", command
        if has_acl:
            assert subprocess.run(["getfacl", "-c", str(nodes)], capture_output=True, text=True).stdout \
                == before_acl, command
    assert nodes.read_bytes() == inst.base_files["nodes.py"]


def test_a_deep_tree_in_applier_s_folder_is_a_clear_refusal_never_a_traceback(tmp_path):
    inst = make_install(tmp_path / "t", layout="plain")
    assert_clean(cli(*inst.args("apply")), allowed=(0,))
    deep = inst.root / ".applier" / "junk"
    os.makedirs(deep)
    fd = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(1200):       # 1,200 nested folders, made relative to the last (no path grows too long)
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    try:
        for command in ("status", "revert", "clean", "apply"):
            out = assert_clean(cli(*inst.args(command)), allowed=(7,))
            assert "nested more than" in out.text, out
    finally:     # removed here, iteratively: pytest's own clean-up of old temp folders recurses
        HeldRoot(inst.root).remove_tree(".applier/junk")


def test_overlay_install_refuses_a_foreign_folder_of_the_pack_s_name(tmp_path):
    inst = make_install(tmp_path / "t", layout="portable")
    mine = inst.comfy / "custom_nodes" / "comfyui_fused_dit"
    (mine / "notes").mkdir(parents=True)
    (mine / "my_node.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    before = snapshot(inst.root)[0]
    out = assert_clean(cli("overlay", "install", "--target", inst.root), allowed=(3,))
    assert "not installed by applier" in out.text
    assert snapshot(inst.root)[0] == before
    assert (mine / "notes").is_dir()


def test_overlay_uninstall_removes_only_what_its_manifest_lists(tmp_path):
    inst = make_install(tmp_path / "t", layout="portable")
    assert_clean(cli("overlay", "install", "--target", inst.root), allowed=(0,))
    node = inst.comfy / "custom_nodes" / "comfyui_fused_dit"
    (node / "my_empty_folder").mkdir()
    (node / "__pycache__").mkdir(exist_ok=True)
    (node / "__pycache__" / "mine.cpython-311.pyc").write_bytes(b"user bytecode")
    assert_clean(cli("overlay", "uninstall", "--target", inst.root), allowed=(0,))
    assert (node / "my_empty_folder").is_dir(), "a user's empty folder was pruned"
    assert (node / "__pycache__" / "mine.cpython-311.pyc").read_bytes() == b"user bytecode"
    assert not any(p.suffix == ".py" for p in node.rglob("*"))
