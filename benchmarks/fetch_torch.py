"""Fill the torch upstream cache that `applier.catalog.check` and docs/coverage.md are built from.

For each torch release, download the small macOS arm64 wheel (the pure-Python torch/cuda/*.py files are identical
across platforms), keep only what the catalog's diffs and version detection need, and delete the wheel:

    <cache>/torch/<version>/torch/cuda/*.py
    <cache>/torch/<version>/torch/version.py
    <cache>/torch/<version>/torch-<version>.dist-info/{METADATA,RECORD}

The cache lives outside the repository (upstream source is never committed). Usage:

    python -m benchmarks upstream torch --cache DIR           # every release below, into DIR/torch
    python -m benchmarks upstream torch --cache DIR 2.13.0    # one release, another cache root

A version already in the cache (it has torch/version.py) is skipped unless --force.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.version import Version

RELEASES = ("2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0",
            "2.12.0", "2.13.0", "2.14.1", "2.15.0")
# macOS arm64 wheels are the smallest (70-140 MB); the platform tag moved from 11.0 to 14.0 after 2.11.
LAST_MACOS11_RELEASE = Version("2.11.99")
KEEP_PATTERNS = ("torch/cuda/*.py", "torch/version.py", "torch-*.dist-info/METADATA", "torch-*.dist-info/RECORD")


def platform_tag(version: str) -> str:
    return "macosx_11_0_arm64" if Version(version) <= LAST_MACOS11_RELEASE else "macosx_14_0_arm64"


def wanted(member: str) -> bool:
    # fnmatch's "*" crosses "/", so also require the depth of the pattern: torch/cuda/amp/*.py is not kept.
    return any(fnmatch.fnmatchcase(member, pat) and member.count("/") == pat.count("/") for pat in KEEP_PATTERNS)


def download_wheel(version: str, dest: Path) -> Path:
    # PIP_CONFIG_FILE=/dev/null: the build machines' pip constraints cap torch; a download must not be capped.
    env = dict(os.environ, PIP_CONFIG_FILE="/dev/null")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--platform", platform_tag(version), "--python-version", "3.11", "--quiet",
           f"torch=={version}", "-d", str(dest)]
    subprocess.run(cmd, check=True, env=env)
    wheels = sorted(dest.glob("torch-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one torch wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def extract(wheel: Path, version_dir: Path) -> int:
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if not wanted(member):
                continue
            target = version_dir / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))
            count += 1
    return count


def fetch(version: str, cache_root: Path, force: bool) -> None:
    version_dir = cache_root / "torch" / version
    if (version_dir / "torch" / "version.py").is_file() and not force:
        print(f"{version}: cached in {version_dir}, skipped")
        return
    if version_dir.exists():
        shutil.rmtree(version_dir)
    with tempfile.TemporaryDirectory(prefix=f"torch-{version}-", dir=cache_root) as tmp:
        wheel = download_wheel(version, Path(tmp))
        size_mb = wheel.stat().st_size / 2**20
        partial = Path(tmp) / "extracted"
        count = extract(wheel, partial)
        wheel.unlink()  # free the disk before the next release downloads
        partial.rename(version_dir)
    print(f"{version}: {count} files from {wheel.name} ({size_mb:.0f} MB, deleted) -> {version_dir}")


def add_arguments(parser) -> None:
    parser.add_argument("versions", nargs="*", default=list(RELEASES), help="torch releases (default: all)")
    parser.add_argument("--cache", type=Path, required=True, help="cache root (DIR): DIR/torch/<version>/...")
    parser.add_argument("--force", action="store_true", help="download again even when cached")


def run(args, parser=None) -> int:
    (args.cache / "torch").mkdir(parents=True, exist_ok=True)
    failed = []
    for version in args.versions:
        try:
            fetch(version, args.cache, args.force)
        except (subprocess.CalledProcessError, RuntimeError, zipfile.BadZipFile) as exc:
            print(f"{version}: FAILED: {exc}", file=sys.stderr)
            failed.append(version)
    return 1 if failed else 0

