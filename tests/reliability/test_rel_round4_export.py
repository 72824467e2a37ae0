"""Reliability round 4 (issue 49): `overlay export` is all or nothing. On a full disk (free space swept around the
point where it starts to succeed, smalldisk.py) into a new folder and into an earlier export, a failure leaves the
destination as it was and no staging folder, and the retry works; an export killed while staging or between its
renames is recovered by the next one."""
from __future__ import annotations

import shutil

import pytest

from reltools import assert_clean, cli, fork_cli, problems_of, record_figure, snapshot, wait_exit
from smalldisk import SmallDisk, sweep

pytestmark = pytest.mark.slow


@pytest.fixture
def disk(tmp_path):
    small = SmallDisk(tmp_path / "disk")
    yield small
    small.close()


def test_overlay_export_on_a_full_disk_leaves_no_half_made_folder(disk, tmp_path):
    """A new folder and an earlier export, swept: after a failure the destination is as it was (absent, or the
    earlier export byte for byte), no staging folder is left, and the retry succeeds."""
    for kind in ("new", "earlier"):
        dest = disk.where / kind / "fused-dit"
        if kind == "earlier":
            assert_clean(cli("overlay", "export", dest), allowed=(0,))
            (dest / "pyproject.toml").write_bytes((dest / "pyproject.toml").read_bytes() + b"\n# the user's\n")
            (dest / "NOTES.md").write_text("the user's own file\n")
        before = snapshot(dest.parent) if dest.parent.exists() else ({}, set())

        def attempt(n: int, dest=dest, before=before):
            if dest.parent.exists():
                shutil.rmtree(dest.parent)
            if before[1] or before[0]:
                for rel in sorted(before[1]):
                    (dest.parent / rel).mkdir(parents=True, exist_ok=True)
                for rel, data in before[0].items():
                    (dest.parent / rel).write_bytes(data)
            disk.set(n)
            try:
                out = disk.run("overlay", "export", dest)
            finally:
                disk.release()
            found = problems_of(out, allowed=(0, 8))
            now = snapshot(dest.parent) if dest.parent.exists() else ({}, set())
            if out.code != 0:
                if now[0] != before[0]:
                    changed = sorted(k for k in set(now[0]) | set(before[0]) if now[0].get(k) != before[0].get(k))
                    found.append(f"a failed export changed files: {changed[:6]}")
                retry = cli("overlay", "export", dest)
                if retry.code != 0:
                    found.append(f"the retry: {retry}")
            if any(".applier-export" in p for p in now[1]):
                found.append("a staging folder was left behind")
            return out.code, found

        result = sweep(f"overlay-export-{kind}", attempt,
                       top=disk.free() - (1 << 20) if disk.mode == "tmpfs" else 1 << 20,
                       floor=disk.floor)
        record_figure("round4-export", mode=disk.mode, **result.figure())
        assert not result.problems(), "\n".join(result.problems()[:10])
        assert any(code != 0 for _, code, _ in result.cases)


def test_an_export_killed_while_staging_is_recovered_by_the_next(tmp_path):
    dest = tmp_path / "out" / "fused-dit"
    pid = fork_cli("overlay", "export", dest, env={"APPLIER_FAILPOINT": "export-staged"})
    assert wait_exit(pid, 60) == 77
    assert not dest.exists(), "the destination appeared before the staged folder was complete"
    out = assert_clean(cli("overlay", "export", dest), allowed=(0,))
    assert "interrupted export" in out.stdout
    assert not (tmp_path / "out" / ".fused-dit.applier-export").exists()
    assert (dest / "pyproject.toml").is_file()


def test_an_export_killed_between_its_renames_is_finished_by_the_next(tmp_path):
    dest = tmp_path / "out" / "fused-dit"
    assert_clean(cli("overlay", "export", dest), allowed=(0,))
    first = snapshot(dest)
    (dest / "pyproject.toml").write_text("[project]\nname = \"fused-dit\"\n")
    pid = fork_cli("overlay", "export", dest, env={"APPLIER_FAILPOINT": "export-file-moved"})
    assert wait_exit(pid, 60) == 77
    assert_clean(cli("overlay", "export", dest), allowed=(0,))
    assert snapshot(dest) == first
