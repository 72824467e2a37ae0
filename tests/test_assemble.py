"""`python -m benchmarks assemble`: the newest reachable ComfyUI rebuilt from a base tree and code-index files, each
checked against the committed provenance. Fake trees of the project's own (no ComfyUI code)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import assemble
from benchmarks.__main__ import main

REPO = Path(__file__).resolve().parent.parent
BASE_COMMIT = "f" * 40


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def inputs(tmp_path):
    base = _write(tmp_path / "base", {"comfyui_version.py": '__version__ = "1.0.0"\n', "pkg/ops.py": "OLD = 1\n",
                                      "pkg/kept.py": "KEPT = 1\n"})
    files = _write(tmp_path / "files", {"comfyui_version.py": '__version__ = "1.1.0"\n', "pkg/ops.py": "NEW = 1\n",
                                        "pkg/added/model.py": "ADDED = 1\n"})
    sources = {"comfyui_version.py": "a" * 40, "pkg/ops.py": "b" * 40, "pkg/added/model.py": "c" * 40}
    return base, files, sources


def test_the_record_names_every_file_and_where_it_came_from(inputs):
    base, files, sources = inputs
    data = assemble.record(base, files, sources, BASE_COMMIT, "1.1.0", "1.0.0")
    rows = {r["path"]: r for r in data["files"]}
    assert sorted(rows) == ["comfyui_version.py", "pkg/added/model.py", "pkg/kept.py", "pkg/ops.py"]
    assert rows["pkg/kept.py"] == {"path": "pkg/kept.py", "source": assemble.BASE_SOURCE, "commit": BASE_COMMIT}
    assert rows["pkg/ops.py"]["source"] == assemble.INDEX_SOURCE and rows["pkg/ops.py"]["commit"] == "b" * 40
    assert rows["pkg/ops.py"]["replaces_base"] and not rows["pkg/added/model.py"]["replaces_base"]
    assert rows["pkg/added/model.py"]["sha256"] == assemble.sha256(files / "pkg/added/model.py")


def test_assemble_rebuilds_the_tree_from_base_and_index_files(inputs, tmp_path):
    base, files, sources = inputs
    provenance = tmp_path / "prov.json"
    sources_file = tmp_path / "sources.json"
    sources_file.write_text(json.dumps(sources))
    assert main(["assemble", "--base", str(base), "--files", str(files), "--record", str(sources_file),
                 "--base-commit", BASE_COMMIT, "--provenance", str(provenance)]) == 0
    out = tmp_path / "out"
    assert main(["assemble", "--base", str(base), "--files", str(files), "--out", str(out),
                 "--provenance", str(provenance)]) == 0
    assert assemble.tree_files(out) == ["comfyui_version.py", "pkg/added/model.py", "pkg/kept.py", "pkg/ops.py"]
    assert (out / "pkg/ops.py").read_text() == "NEW = 1\n" and (out / "pkg/kept.py").read_text() == "KEPT = 1\n"


def test_a_file_read_from_another_repository_is_recorded_and_assembled_as_an_index_file(inputs, tmp_path):
    # the index lacks some files under Comfy-Org/ComfyUI; the record names the repository each was read from
    base, files, sources = inputs
    sources["pkg/added/model.py"] = {"commit": "d" * 40, "repo": "comfyanonymous/ComfyUI"}
    sources["pkg/ops.py"] = {"commit": "b" * 40}
    data = assemble.record(base, files, sources, BASE_COMMIT, "1.1.0", "1.0.0")
    rows = {r["path"]: r for r in data["files"]}
    assert rows["pkg/added/model.py"]["source"] == "github:comfyanonymous/ComfyUI (code index)"
    assert rows["pkg/added/model.py"]["commit"] == "d" * 40
    assert rows["pkg/ops.py"]["source"] == assemble.INDEX_SOURCE and rows["pkg/ops.py"]["commit"] == "b" * 40
    assert data["index_files"] == 3
    done = assemble.assemble(base, files, tmp_path / "out", data)
    assert done["from_index"] == ["comfyui_version.py", "pkg/added/model.py", "pkg/ops.py"]
    assert (tmp_path / "out/pkg/added/model.py").read_text() == "ADDED = 1\n"
    (files / "pkg/added/model.py").write_text("ADDED = 2\n")
    with pytest.raises(assemble.AssembleError, match="pkg/added/model.py"):
        assemble.assemble(base, files, tmp_path / "out2", data)


@pytest.mark.parametrize("tamper", ["index file changed", "index file absent", "base has an unrecorded file",
                                    "base lacks a recorded file"])
def test_assemble_refuses_inputs_that_differ_from_the_record_and_writes_nothing(inputs, tmp_path, tamper):
    base, files, sources = inputs
    provenance = assemble.record(base, files, sources, BASE_COMMIT, "1.1.0", "1.0.0")
    if tamper == "index file changed":
        (files / "pkg/ops.py").write_text("NEW = 2\n")
    elif tamper == "index file absent":
        (files / "pkg/added/model.py").unlink()
    elif tamper == "base has an unrecorded file":
        (base / "pkg/stray.py").write_text("")
    else:
        (base / "pkg/kept.py").unlink()
    with pytest.raises(assemble.AssembleError):
        assemble.assemble(base, files, tmp_path / "out", provenance)
    assert not (tmp_path / "out").exists()


def test_the_committed_provenance_names_every_file_with_its_source():
    data = json.loads(assemble.DEFAULT_PROVENANCE.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", data["base"]["commit"])
    paths = [r["path"] for r in data["files"]]
    assert paths == sorted(set(paths)) and "comfyui_version.py" in paths
    for row in data["files"]:
        assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]) and not row["path"].startswith("/")
        if assemble.from_index(row):
            assert re.fullmatch(r"[0-9a-f]{64}", row["sha256"])
            assert re.fullmatch(r"github:[\w.-]+/[\w.-]+ \(code index\)", row["source"])
        else:
            assert row["source"] == assemble.BASE_SOURCE and row["commit"] == data["base"]["commit"]
    assert sum(assemble.from_index(r) for r in data["files"]) == data["index_files"] > 0
    assert str(REPO) not in assemble.DEFAULT_PROVENANCE.read_text()
