"""patch.toml is data: every malformed catalog is a CatalogError (exit 3) naming the file and the key, never another
exception; a --patches folder without any patch is an error, not an empty catalog."""
from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.catalog import CatalogError, load_catalog
from applier.errors import EXIT_REFUSED
from applier.resources import PATCHES_DIR
from tests.shelltools import MAXRES_DIFF, make_comfy, run_cli, tree_bytes, write_patch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GOOD_TOML = textwrap.dedent("""\
    title = "t"
    [[variant]]
    name = "all"
    versions = ">=0"
    diff = "x.diff"
""")


def one_patch(tmp_path: Path, toml: str | bytes, files: dict[str, str] | None = None) -> Path:
    folder = tmp_path / "catalog" / "comfyui" / "p"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    for name, text in (files if files is not None else {"x.diff": MAXRES_DIFF}).items():
        (folder / name).write_text(text)
    return tmp_path / "catalog"


MALFORMED = {
    "non-utf8 byte": (GOOD_TOML.encode().replace(b'"t"', b'"\xff"'), "not UTF-8"),
    "[variant] as a table": (GOOD_TOML.replace("[[variant]]", "[variant]"), "'variant' must be an array of tables"),
    "diff = 5": (GOOD_TOML.replace('diff = "x.diff"', "diff = 5"), "'diff' must be"),
    "versions as a list": (GOOD_TOML.replace('versions = ">=0"', 'versions = [">=0"]'), "'versions' must be"),
    "name as a list": (GOOD_TOML.replace('name = "all"', 'name = ["all"]'), "'name' must be"),
    "title as a number": (GOOD_TOML.replace('title = "t"', "title = 3"), "'title' must be"),
    "default as a string": ('default = "yes"\n' + GOOD_TOML, "'default' must be"),
    "tested as a string": (GOOD_TOML + 'tested = "0.3.1"\n', "'tested' must be"),
    "shared as a string": ('shared = "h.diff"\n' + GOOD_TOML, "'shared' must be"),
    "shared file missing": ('shared = ["h.diff"]\n' + GOOD_TOML, "h.diff is missing"),
    "diff outside the folder": (GOOD_TOML.replace('"x.diff"', '"../x.diff"'), "must name a file inside"),
    "absolute diff": (GOOD_TOML.replace('"x.diff"', '"/etc/passwd"'), "must name a file inside"),
    "missing diff file": (GOOD_TOML.replace('"x.diff"', '"y.diff"'), "y.diff is missing"),
    "unknown key": (GOOD_TOML + 'diffs = "x.diff"\n', "unknown key 'diffs'"),
    "variant lacks name": (GOOD_TOML.replace('name = "all"\n', ""), "lacks 'name'"),
    "bad specifier": (GOOD_TOML.replace('">=0"', '"~~1"'), "bad specifier"),
    "no variant": ('title = "t"\n', "no [[variant]]"),
    "requires_text bad regex": (GOOD_TOML + '[[requires_text]]\nfile = "nodes.py"\npattern = "("\n',
                                "not a regular expression"),
    "requires_text as a string": ('requires_text = "nodes.py"\n' + GOOD_TOML, "'requires_text' must be"),
    "requires unknown patch": ('requires = ["comfyui/nope"]\n' + GOOD_TOML, "not another patch"),
    "requires not an id": ('requires = ["nope"]\n' + GOOD_TOML, "not a patch id"),
    "toml syntax": (GOOD_TOML + "name = \n", "not valid TOML"),
    "diff name too long": (GOOD_TOML.replace('"x.diff"', '"' + "x" * 5000 + '.diff"'), "diff"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_each_malformed_patch_toml_is_a_catalog_error_naming_the_file(tmp_path, case):
    toml, expected = MALFORMED[case]
    catalog = one_patch(tmp_path, toml)
    with pytest.raises(CatalogError) as caught:
        load_catalog(catalog)
    assert expected in caught.value.message and "patch.toml" in caught.value.message
    assert caught.value.exit_code == EXIT_REFUSED


def test_the_well_formed_one_loads(tmp_path):
    (patch,) = load_catalog(one_patch(tmp_path, GOOD_TOML))
    assert patch.id == "comfyui/p" and [v.name for v in patch.variants] == ["all"]


@pytest.mark.parametrize("layout", ["empty", "component only", "no patch.toml"])
def test_a_catalog_folder_without_any_patch_is_an_error(tmp_path, layout):
    root = tmp_path / "catalog"
    root.mkdir()
    if layout != "empty":
        (root / "comfyui").mkdir()
    if layout == "no patch.toml":
        (root / "comfyui" / "p").mkdir()
        (root / "comfyui" / "p" / "x.diff").write_text(MAXRES_DIFF)
    with pytest.raises(CatalogError, match="holds no patch"):
        load_catalog(root)


@pytest.mark.parametrize("command", [("apply",), ("status",), ("list",), ("revert",)])
def test_patches_pointing_at_an_empty_folder_exits_3_and_changes_nothing(tmp_path, command):
    comfy = make_comfy(tmp_path)
    (tmp_path / "empty").mkdir()
    before = tree_bytes(comfy)
    proc = run_cli(*command, "--target", str(comfy), "--patches", str(tmp_path / "empty"))
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert "holds no patch" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_bytes(comfy) == before


def test_a_malformed_catalog_is_exit_3_from_the_cli(tmp_path):
    comfy = make_comfy(tmp_path)
    catalog = one_patch(tmp_path, MALFORMED["diff = 5"][0])
    proc = run_cli("apply", "--target", str(comfy), "--patches", str(catalog))
    assert proc.returncode == EXIT_REFUSED and "'diff' must be" in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------- fuzzing the real catalog

def _real_tomls() -> list[Path]:
    return sorted(PATCHES_DIR.glob("*/*/patch.toml"))


def _replacement_values():
    return st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=12),
                     st.lists(st.text(max_size=6), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                                max_size=2))


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml_value(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


@st.composite
def mutated_catalog(draw):
    tomls = _real_tomls()
    target = draw(st.sampled_from(tomls))
    data = target.read_bytes()
    kind = draw(st.sampled_from(["retype", "bytes", "drop", "table"]))
    lines = data.split(b"\n")
    keyed = [i for i, line in enumerate(lines) if b"=" in line and not line.startswith((b"#", b" "))]
    if kind == "retype" and keyed:
        i = draw(st.sampled_from(keyed))
        key = lines[i].split(b"=", 1)[0].strip()
        lines[i] = key + b" = " + _toml_value(draw(_replacement_values())).encode("utf-8")
        data = b"\n".join(lines)
    elif kind == "drop" and keyed:
        del lines[draw(st.sampled_from(keyed))]
        data = b"\n".join(lines)
    elif kind == "table":
        data = data.replace(b"[[variant]]", b"[variant]", draw(st.integers(1, 2)))
    else:
        at = draw(st.integers(0, max(0, len(data) - 1)))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    return target.relative_to(PATCHES_DIR), data


# APPLIER_FUZZ_EXAMPLES raises the count for a longer campaign (e.g. 10000); CI runs a few hundred.
@settings(max_examples=int(os.environ.get("APPLIER_FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated_catalog())
def test_a_mutated_real_catalog_loads_or_raises_only_catalog_error(tmp_path_factory, mutation):
    relpath, data = mutation
    root = tmp_path_factory.mktemp("catalog")
    shutil.copytree(PATCHES_DIR, root, dirs_exist_ok=True)
    (root / relpath).write_bytes(data)
    try:
        catalog = load_catalog(root)
    except CatalogError as exc:
        assert str(relpath.parent) in exc.message.replace("\\", "/") or "holds no patch" in exc.message
        return
    # It loaded: then the mutation left a valid patch.toml, and every patch is usable as data.
    tomllib.loads(data.decode("utf-8"))
    for patch in catalog:
        assert isinstance(patch.title, str) and isinstance(patch.default, bool)
        for variant in patch.variants:
            assert isinstance(variant.name, str) and variant.diff_path.is_file()
