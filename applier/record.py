"""A wheel's RECORD: the sha256 of every file as installed, the ground truth for "pristine"."""
from __future__ import annotations

import base64
import csv
import io
from pathlib import Path


def find_record(site_packages: Path, distribution: str) -> Path | None:
    """<site-packages>/<distribution>-<version>.dist-info/RECORD, None when absent."""
    prefix = distribution.replace("-", "_").lower() + "-"
    try:
        entries = sorted(Path(site_packages).iterdir())
    except OSError:
        return None
    for entry in entries:
        name = entry.name.lower()
        if name.startswith(prefix) and name.endswith(".dist-info") and (entry / "RECORD").is_file():
            return entry / "RECORD"
    return None


def read_record(record: Path) -> dict[str, str]:
    """{relative path: hex sha256} for every RECORD row that carries a sha256."""
    hashes = {}
    text = Path(record).read_text(encoding="utf-8", errors="replace")
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 2 or not row[1].startswith("sha256="):
            continue
        digest = row[1][len("sha256="):]
        padded = digest + "=" * (-len(digest) % 4)
        hashes[row[0]] = base64.urlsafe_b64decode(padded).hex()
    return hashes


def pristine_hashes(site_packages: Path | None, distribution: str = "torch") -> dict[str, str]:
    if site_packages is None:
        return {}
    record = find_record(site_packages, distribution)
    return read_record(record) if record else {}
