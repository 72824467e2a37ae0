"""The held install handle (applier/store/heldroot.py): links resolved under the root by its own rules, never followed
out; writes atomic and keeping the replaced file's rights; walks iterative and bounded. The fd-based HeldRoot and
the path fallback (PathRoot, for platforms without dir_fd) are held to the same rules where they can be."""
from __future__ import annotations

import os
import stat

import pytest

from applier.store.fileops import LeadsOutside, NotRegularFile, WalkLimit, is_temp_name, temp_name
from applier.store.heldroot import HeldRoot, PathRoot

KINDS = [HeldRoot, PathRoot]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "ComfyUI"
    (root / "comfy" / "ldm").mkdir(parents=True)
    (root / "nodes.py").write_bytes(b"MAX_RESOLUTION = 16384\n")
    (root / "comfy" / "ldm" / "flux.py").write_bytes(b"flux\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_bytes(b"secret\n")
    return root, outside


@pytest.mark.parametrize("kind", KINDS)
def test_a_link_that_stays_inside_is_followed_for_reads_and_writes(tree, kind):
    root, _ = tree
    (root / "alias.py").symlink_to("comfy/ldm/flux.py")
    (root / "comfy" / "up.py").symlink_to("../nodes.py")
    (root / "absolute.py").symlink_to(root / "nodes.py")
    held = kind(root)
    assert held.read("alias.py", limit=100) == b"flux\n"
    assert held.read("comfy/up.py", limit=100) == b"MAX_RESOLUTION = 16384\n"
    assert held.read("absolute.py", limit=100) == b"MAX_RESOLUTION = 16384\n"
    held.write("alias.py", b"new flux\n")
    assert (root / "alias.py").is_symlink() and (root / "comfy" / "ldm" / "flux.py").read_bytes() == b"new flux\n"


@pytest.mark.parametrize("kind", KINDS)
def test_a_link_leading_out_is_refused_for_every_operation(tree, kind):
    root, outside = tree
    (root / "evil.py").symlink_to(outside / "secret.py")
    (root / "up.py").symlink_to("../outside/secret.py")
    (root / "custom_nodes").symlink_to(outside, target_is_directory=True)
    held = kind(root)
    for rel in ("evil.py", "up.py", "custom_nodes/secret.py"):
        with pytest.raises(LeadsOutside):
            held.read(rel, limit=100)
        with pytest.raises(LeadsOutside):
            held.write(rel, b"pwned\n")
    with pytest.raises(LeadsOutside):
        held.write("custom_nodes/new/file.py", b"pwned\n")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.py"]
    assert (outside / "secret.py").read_bytes() == b"secret\n"


def test_a_link_swapped_over_the_file_between_walk_and_rename_is_replaced_never_followed(tree):
    root, outside = tree
    held = HeldRoot(root)
    fd, name, _ = held.walk_to("nodes.py")
    try:
        os.unlink(root / "nodes.py")
        (root / "nodes.py").symlink_to(outside / "secret.py")      # after the walk, before the write
    finally:
        os.close(fd)
    with pytest.raises(LeadsOutside):
        held.write("nodes.py", b"patched\n")
    assert (outside / "secret.py").read_bytes() == b"secret\n"


def test_no_link_at_all_where_links_are_refused(tree):
    root, _ = tree
    (root / "comfy" / "inner.py").symlink_to("ldm/flux.py")
    held = HeldRoot(root, links=False)
    with pytest.raises(NotRegularFile, match="symbolic link"):
        held.read("comfy/inner.py", limit=100)
    with pytest.raises(NotRegularFile, match="symbolic link"):
        held.write("comfy/inner.py", b"x")


def test_special_files_are_refused_unopened(tree):
    root, _ = tree
    os.mkfifo(root / "pipe.py")
    with pytest.raises(NotRegularFile, match="FIFO"):
        HeldRoot(root).read("pipe.py", limit=100)
    with pytest.raises(NotRegularFile, match="FIFO"):
        HeldRoot(root).write("pipe.py", b"x")


def test_a_write_keeps_mode_setuid_and_extended_attributes(tree):
    root, _ = tree
    nodes = root / "nodes.py"
    os.chmod(nodes, 0o4751)
    try:
        os.setxattr(nodes, "user.origin", b"mine")
        xattrs = True
    except OSError:
        xattrs = False
    HeldRoot(root).write("nodes.py", b"patched\n")
    assert stat.S_IMODE(nodes.stat().st_mode) == 0o4751
    if xattrs:
        assert os.getxattr(nodes, "user.origin") == b"mine"


def test_remove_tree_and_walk_are_iterative_and_bounded(tree):
    root, _ = tree
    fd = os.open(root, os.O_RDONLY)
    for _ in range(1500):       # deeper than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    held = HeldRoot(root)
    try:
        with pytest.raises(WalkLimit, match="nested more than 64"):
            list(held.walk("", max_depth=64, max_entries=10_000))
        with pytest.raises(WalkLimit, match="more than 3 entries"):
            list(held.walk("", max_depth=5000, max_entries=3))
    finally:    # removed here in any case: pytest's own clean-up of old temp folders recurses
        held.remove_tree("d")
    assert not (root / "d").exists()


def test_temp_names_carry_a_marker_no_user_file_shares_by_chance():
    name = temp_name("nodes.py")
    assert is_temp_name(name) and name.startswith(".nodes.py.applier-")
    for users in (".nodes.py.k3j2h1.applier-tmp", ".notes.applier-tmp", "nodes.applier-tmp",
                  ".x.applier-0123.applier-tmp"):
        assert not is_temp_name(users), users
