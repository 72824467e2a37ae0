"""Authoring (`applier catalog refresh`): a new variant's diff from an upstream file and an edited copy, kept byte
for byte, CR bytes included."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from applier import diffengine
from applier.catalog import load_patch
from applier.catalog.authoring import add_variant
from applier.errors import RefusedError


def make_patch(tmp_path: Path):
    folder = tmp_path / "comfyui" / "demo"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(textwrap.dedent("""\
        title = "A demo patch"
        [[variant]]
        name = "first"
        versions = "<1"
        diff = "comfyui-first.diff"
    """))
    (folder / "comfyui-first.diff").write_bytes(diffengine.unified_diff(b"a\n", b"b\n", "demo.py"))
    return load_patch(folder, "comfyui")


@pytest.mark.parametrize("upstream, edited", [
    (b"x = 1\r\ny = 2\r", b"x = 1\r\ny = 3\r"),           # a CRLF file whose last line has no newline: "\r" stays
    (b"x = 1\ny = 2\r\r\n", b"x = 1\ny = 2\r\n"),          # a CR inside a line's content, before its CRLF
    (b"keep\r\nlone \r cr\nend", b"keep\r\nlone \r CR\nend\r"),
])
def test_a_new_variant_keeps_every_carriage_return(tmp_path, upstream, edited):
    patch = make_patch(tmp_path)
    diff_path = add_variant(patch, upstream, edited, "demo.py", ">=1", "second")
    (fp,) = diffengine.parse_patch(diff_path.read_bytes())
    assert diffengine.plan_file(fp, upstream).new == edited
    assert diffengine.plan_file(diffengine.reverse_file_patch(fp), edited).new == upstream
    reloaded = load_patch(patch.folder, "comfyui")
    assert [variant.name for variant in reloaded.variants] == ["first", "second"]


def test_an_edited_file_identical_to_upstream_is_refused(tmp_path):
    with pytest.raises(RefusedError):
        add_variant(make_patch(tmp_path), b"same\r", b"same\r", "demo.py", ">=1", "second")
