"""Hints point at things a user has: the catalog's format document exists wherever applier runs from."""
from __future__ import annotations

from pathlib import Path

import pytest

from applier.catalog import FORMAT_DOC, load_catalog
from applier.errors import RefusedError


def test_the_catalog_format_hint_names_a_file_that_exists():
    assert Path(FORMAT_DOC).is_file(), FORMAT_DOC


def test_a_wrong_catalog_folder_hint_names_the_existing_format_document(tmp_path):
    (tmp_path / "nothing-here").mkdir()
    with pytest.raises(RefusedError) as caught:
        load_catalog(tmp_path / "nothing-here")
    assert FORMAT_DOC in (caught.value.hint or "")
    assert "(patches/README.md)" not in str(caught.value)
