"""scripts/sweep_comfyui.py on a small git history built by the fixture: exports, the CLI on each tree, the JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.comfy_tree import build_comfy_tree, tree_files, ERAS

REPO = Path(__file__).resolve().parent.parent


def commit_era(comfy: Path, era: str, tag: str | None) -> None:
    for rel, text in tree_files(ERAS[era]).items():
        path = comfy / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = ["-c", "user.email=t@t", "-c", "user.name=t", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"]
    subprocess.run(["git", "-C", str(comfy), *env, "add", "-A"], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(comfy), *env, "commit", "-qm", era], check=True, capture_output=True)
    if tag:
        subprocess.run(["git", "-C", str(comfy), *env, "tag", tag], check=True, capture_output=True)


@pytest.mark.slow
def test_the_sweep_runs_apply_status_revert_on_every_export_and_writes_the_json(tmp_path):
    comfy = build_comfy_tree(tmp_path / "mirror", era="2023-06", layout="git")
    commit_era(comfy, "0.3.43", "v0.3.43")
    commit_era(comfy, "0.38", None)             # a version bump without a tag: still a release commit
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "sweep_comfyui.py"), "--mirror", str(comfy / ".git"),
                           "-n", "1", "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["kind"] == "comfyui-sweep" and "command" in report["environment"]
    trees = {row["version"]: row for row in report["trees"]}
    assert set(trees) == {None, "0.3.43", "0.38.1"}
    assert trees["0.3.43"]["tag"] == "v0.3.43" and trees["0.38.1"]["tag"] == "v0.38.1"
    assert trees["0.38.1"]["patches"]["comfyui/oom-retry"]["variant"] == "async-execute-try-finally"
    assert trees[None]["patches"]["comfyui/oom-retry"]["variant"] == "recursive-execute"
    assert all(row["byte_identical"] and row["outcome"] == "ok" for row in report["trees"])
    assert report["summary"]["byte_identical_after_revert"] == 3 and not report["refused"]
    assert str(tmp_path) not in out.read_text()
