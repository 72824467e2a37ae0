"""integrity: an applied patch's files must still hold the bytes recorded at apply time."""
from __future__ import annotations

import hashlib
from pathlib import Path

from applier.catalog import load_catalog
from applier.resources import load_verify
from applier.store.applied import AppliedFile, AppliedPatch, State
from applier.target import Target

verify = load_verify()
Outcome = verify.Outcome

ORIGINAL = b"MAX_RESOLUTION = 16384\r\n"
PATCHED = b"MAX_RESOLUTION = 40960\r\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_target(root: Path) -> Target:
    return Target(root=root, layout="plain", comfyui_root=root, comfyui_version="0.3.64",
                  comfyui_version_source="comfyui_version.py", comfyui_commit=None, python=None,
                  python_source="none", python_version=None, site_packages=None, torch_version=None,
                  torch_cuda=None, triton_version=None)


RETIRED = "comfyui/retired-patch"


def applied(root: Path, patch_id: str = RETIRED) -> State:
    """State as apply leaves it, for a patch that is no longer in the catalog (so only hashes decide); its file,
    nodes.py, is one the catalog still touches (the state may name no other)."""
    nodes = root / "nodes.py"
    nodes.write_bytes(PATCHED)
    record = AppliedPatch(id=patch_id, variant="all", component="comfyui",
                          files=[AppliedFile(relpath="nodes.py", sha256_before=sha(ORIGINAL),
                                             sha256_after=sha(PATCHED), backup=f"backups/{patch_id}/comfyui/nodes.py")],
                          component_version="0.3.64", applied_at="2026-11-30T00:00:00Z")
    return State({patch_id: record})


def integrity(root: Path, state: State):
    catalog = [p for p in load_catalog() if p.id != RETIRED]
    options = verify.VerifyOptions(target=make_target(root), catalog=catalog, state=state, only=("integrity",))
    (result,) = verify.run_verify(options)
    return result


def test_intact_applied_files_pass(tmp_path):
    result = integrity(tmp_path, applied(tmp_path))
    assert result.outcome is Outcome.PASS
    assert result.numbers["intact"] == [RETIRED]


def test_hand_edited_file_fails_as_modified(tmp_path):
    state = applied(tmp_path)
    (tmp_path / "nodes.py").write_bytes(b"MAX_RESOLUTION = 32768\r\n")
    result = integrity(tmp_path, state)
    assert result.outcome is Outcome.FAIL
    assert result.numbers["problems"][RETIRED]["state"] == "modified"
    assert f"{RETIRED} modified" in result.reason


def test_file_back_to_its_original_bytes_fails_as_lost(tmp_path):
    state = applied(tmp_path)
    (tmp_path / "nodes.py").write_bytes(ORIGINAL)      # what `git pull` or an update does
    result = integrity(tmp_path, state)
    assert result.outcome is Outcome.FAIL
    assert result.numbers["problems"][RETIRED]["state"] == "lost"


def test_deleted_file_fails_as_lost(tmp_path):
    state = applied(tmp_path)
    (tmp_path / "nodes.py").unlink()
    result = integrity(tmp_path, state)
    assert result.outcome is Outcome.FAIL
    assert "lost" in result.reason


def test_nothing_applied_is_a_skip_not_a_pass(tmp_path):
    result = integrity(tmp_path, State())
    assert result.outcome is Outcome.SKIP
    assert verify.summarize([result])["PASS"] == 0
