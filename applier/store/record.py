"""A wheel's RECORD: the sha256 of every file as installed, the ground truth for "pristine"."""
from __future__ import annotations

import base64
import binascii
import csv
import io
from pathlib import Path

from applier.errors import IOFailure
from applier.store.fsutil import read_inside

MAX_RECORD_BYTES = 64 * 1024 * 1024     # torch's RECORD is ~2 MB


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


def read_record(record: Path, inside: Path | None = None) -> dict[str, str]:
    """{relative path: hex sha256} for every RECORD row that carries a readable sha256. Read bounded, regular files
    only, and only where it really lies inside `inside` (default: site-packages, two folders up) (fsutil.read_inside:
    IOFailure for a FIFO, a device, a file past MAX_RECORD_BYTES, a link leading out); a row whose digest is not
    the base64 of 32 bytes is skipped."""
    hashes = {}
    record = Path(record)
    inside = record.parent.parent if inside is None else inside
    text = read_inside(inside, record, limit=MAX_RECORD_BYTES).decode("utf-8", errors="replace")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error:        # a NUL byte, a field past csv's size limit: not a RECORD pip wrote
        return {}
    for row in rows:
        if len(row) < 2 or not row[1].startswith("sha256="):
            continue
        digest = row[1][len("sha256="):]
        padded = digest + "=" * (-len(digest) % 4)
        try:
            decoded = base64.b64decode(padded, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(decoded) == 32:
            hashes[row[0]] = decoded.hex()
    return hashes


def pristine_hashes(site_packages: Path | None, distribution: str = "torch") -> dict[str, str]:
    if site_packages is None:
        return {}
    record = find_record(site_packages, distribution)
    if record is None:
        return {}
    try:
        return read_record(record, site_packages)
    except IOFailure:   # a link leading out, a FIFO, a device, far too large: no RECORD pip wrote for this install
        return {}
