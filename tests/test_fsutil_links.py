"""The bytes-on-disk layer and the confinement it serves, against links that lead out of the folder a walk must stay
in (reliability round 3): nothing is opened, listed or removed there, and no special file is even opened."""
from __future__ import annotations

import os

import pytest

from applier.store import fsutil
from applier.store.confine import Confinement, OverlayPrefixes
from applier.store.fsutil import LeadsOutside, NotRegularFile, read_inside, read_regular, remove_stale_bytecode
from applier.store.record import pristine_hashes


@pytest.fixture
def opened(monkeypatch):
    """Every path os.open is asked to open, in order."""
    seen: list[str] = []
    real = os.open

    def recording(path, *args, **kwargs):
        seen.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fsutil.os, "open", recording)
    return seen


def test_a_device_is_refused_without_being_opened(tmp_path, opened):
    link = tmp_path / "nodes.py"
    link.symlink_to(os.devnull)
    with pytest.raises(NotRegularFile, match="character device"):
        read_regular(link)
    assert opened == [], "a device was opened (opening one can act: a watchdog arms, a tape rewinds)"


def test_a_fifo_is_refused_without_being_opened(tmp_path, opened, hang_guard):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile, match="FIFO"):
        read_regular(fifo)
    assert opened == []


def test_read_inside_refuses_a_link_leading_out_without_opening_it(tmp_path, opened):
    top = tmp_path / "ComfyUI"
    top.mkdir()
    secret = tmp_path / "secret.py"
    secret.write_text("token = 1\n")
    (top / "comfyui_version.py").symlink_to(secret)
    with pytest.raises(LeadsOutside, match="link leading outside"):
        read_inside(top, top / "comfyui_version.py")
    assert opened == []
    (top / "real.py").write_text("x = 1\n")
    (top / "alias.py").symlink_to("real.py")            # a link that stays inside is followed
    assert read_inside(top, top / "alias.py") == b"x = 1\n"


def test_a_folder_on_the_way_that_leads_out_is_refused_too(tmp_path):
    top = tmp_path / "site-packages"
    top.mkdir()
    elsewhere = tmp_path / "elsewhere" / "torch"
    elsewhere.mkdir(parents=True)
    (elsewhere / "version.py").write_text("__version__ = '9.9'\n")
    (top / "torch").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(LeadsOutside):
        read_inside(top, top / "torch" / "version.py")


def test_stale_bytecode_is_removed_from_a_real_pycache_only(tmp_path):
    folder = tmp_path / "comfy"
    folder.mkdir()
    source = folder / "nodes.py"
    source.write_text("x = 1\n")
    outside = tmp_path / "outside-pycache"
    outside.mkdir()
    (outside / "nodes.cpython-311.pyc").write_bytes(b"theirs")
    (folder / "__pycache__").symlink_to(outside, target_is_directory=True)
    assert remove_stale_bytecode(source) == []
    assert (outside / "nodes.cpython-311.pyc").read_bytes() == b"theirs"
    (folder / "__pycache__").unlink()
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "nodes.cpython-311.pyc").write_bytes(b"stale")
    assert [p.name for p in remove_stale_bytecode(source)] == ["nodes.cpython-311.pyc"]


def test_confinement_walks_no_folder_a_link_leads_out_of_its_root(tmp_path):
    comfy = tmp_path / "ComfyUI"
    site = comfy / "venv" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (comfy / "custom_nodes").mkdir()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "cuda").mkdir(parents=True)
    (elsewhere / "node").mkdir()
    (site / "torch" / "cuda").symlink_to(elsewhere / "cuda", target_is_directory=True)
    (comfy / "custom_nodes" / "comfyui_fused_dit").symlink_to(elsewhere / "node", target_is_directory=True)
    confinement = Confinement({"comfyui": comfy, "purelib": site, "site-packages": site}, comfy / ".applier",
                              {"comfyui": {"nodes.py"}, "site-packages": {"torch/cuda/streams.py",
                                                                          "torch/version.py"}},
                              OverlayPrefixes("fused_dit", "comfyui_fused_dit"))
    assert confinement.catalog_folders() == sorted([comfy, site / "torch"])
    assert confinement.overlay_tops() == [site / "fused_dit"]


def test_a_record_a_link_leads_out_of_site_packages_is_no_record(tmp_path):
    site = tmp_path / "site-packages"
    dist = site / "torch-2.0.dist-info"
    dist.mkdir(parents=True)
    foreign = tmp_path / "RECORD"
    foreign.write_text("torch/a.py,sha256=" + "A" * 43 + ",10\n")
    (dist / "RECORD").symlink_to(foreign)
    assert pristine_hashes(site) == {}
    (dist / "RECORD").unlink()
    (dist / "RECORD").write_text(foreign.read_text())
    assert list(pristine_hashes(site)) == ["torch/a.py"]



def test_a_record_too_large_to_be_pips_is_no_record_either(tmp_path, monkeypatch):
    from applier.store import record
    site = tmp_path / "site-packages"
    dist = site / "torch-2.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "RECORD").write_text("torch/a.py,sha256=" + "A" * 43 + ",10\n")
    monkeypatch.setattr(record, "MAX_RECORD_BYTES", 8)
    assert pristine_hashes(site) == {}, "status and revert would fail on a RECORD they only use as a hint"


def test_a_file_where_a_folder_must_be_is_named_as_such_not_as_permission_denied(tmp_path):
    from applier.errors import IOFailure
    from applier.store.fsutil import check_writable
    (tmp_path / "custom_nodes").write_text("not a folder\n")
    with pytest.raises(IOFailure, match="a folder on the way is a file"):
        check_writable(tmp_path / "custom_nodes" / "comfyui_fused_dit" / "__init__.py")
