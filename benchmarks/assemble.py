"""The newest ComfyUI release this kit can reach, assembled: a real tree plus newer files read from a code index.

No full tree newer than 0.33.0 can be fetched; a code index holds single files of Comfy-Org/ComfyUI up to 0.38.1.
The assembled tree is the real 0.33.0 tree (exported from a git mirror, `node_pack.export_tree`) with each file
the index holds in a newer version put in its place (or added). Which file comes from where is committed as a
provenance JSON (benchmarks/results/assembled-tree-<version>.json): every file of the tree, with
{"source", "commit", "path"} for the base tree's and, for the index's, their sha256 too. No ComfyUI code is
committed: this command rebuilds the tree from the two folders a maintainer has and checks every index file
against its recorded sha256 (and the base tree's file list against the record) before writing anything.

    python -m benchmarks assemble --base TREE --files DIR --out DIR        # rebuild, checking every file
    python -m benchmarks assemble --base TREE --files DIR --record SOURCES --base-commit HASH --version V
        # write the provenance: SOURCES is a JSON {path: commit} of the files in DIR (the commit the index named),
        # or {path: {"commit": ..., "repo": OWNER/NAME}} for a file the index holds only under another repository
        # (Comfy-Org/ComfyUI's former name comfyanonymous/ComfyUI, or a fork): its row names that repository
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from . import results

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BASE_SOURCE = "github:jwijaya83/ComfyUI"
INDEX_REPO = "Comfy-Org/ComfyUI"


def index_source(repo: str = INDEX_REPO) -> str:
    return f"github:{repo} (code index)"


INDEX_SOURCE = index_source()
DEFAULT_PROVENANCE = RESULTS / "assembled-tree-0.38.1.json"


class AssembleError(Exception):
    pass


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def from_index(row: dict) -> bool:
    """A row of a file read from the code index (Comfy-Org/ComfyUI's or, where it lacks the file, another's)."""
    return row["source"].endswith(" (code index)")


def tree_files(root: Path) -> list[str]:
    """Relative paths of the regular files under root, sorted (links refused: a tree is plain files)."""
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise AssembleError(f"{path}: a link in a tree to assemble")
        if path.is_file():
            out.append(path.relative_to(root).as_posix())
    return out


def record(base: Path, files: Path, sources: dict[str, str], base_commit: str, version: str,
           base_version: str, missing_from_base: list[str] = ()) -> dict:
    """The provenance of base + files: every file of the assembled tree and where it came from. sources[path] is the
    commit the index named, or {"commit": ..., "repo": ...} for a file read from another repository than
    Comfy-Org/ComfyUI."""
    index_paths = sorted(sources)
    absent = [p for p in index_paths if not (files / p).is_file()]
    if absent:
        raise AssembleError(f"named in the sources but not in {files}: {', '.join(absent)}")
    rows = {p: {"path": p, "source": BASE_SOURCE, "commit": base_commit} for p in tree_files(base)}
    for p in index_paths:
        entry = sources[p] if isinstance(sources[p], dict) else {"commit": sources[p]}
        rows[p] = {"path": p, "source": index_source(entry.get("repo") or INDEX_REPO), "commit": entry["commit"],
                   "sha256": sha256(files / p), "replaces_base": p in rows}
    return {"what": f"ComfyUI {version} as far as it can be reached: the real {base_version} tree ({BASE_SOURCE} at "
                    f"{base_commit}) with the newest version the code index holds of each file the overlay pack or "
                    "starting ComfyUI needs (read from another repository, named in its row, where the index holds "
                    "no Comfy-Org/ComfyUI version); every file of the tree and where it came from",
            "version": version, "base": {"source": BASE_SOURCE, "commit": base_commit, "version": base_version,
                                         "missing_from_mirror": sorted(missing_from_base)},
            "index_files": len(index_paths), "command": "python -m benchmarks assemble --base TREE --files DIR "
                                                        "--out DIR",
            "files": [rows[p] for p in sorted(rows)]}


def assemble(base: Path, files: Path, out: Path, provenance: dict) -> dict:
    """Write the assembled tree to out (which must not exist) after checking both inputs against provenance."""
    rows = provenance["files"]
    expected_base = {r["path"] for r in rows if r["source"] == BASE_SOURCE}
    replaced = {r["path"] for r in rows if from_index(r) and r.get("replaces_base")}
    found_base = set(tree_files(base))
    missing = sorted((expected_base | replaced) - found_base)
    extra = sorted(found_base - expected_base - replaced)
    if missing or extra:
        raise AssembleError(f"the base tree is not the recorded one: missing {missing[:5]}, not recorded "
                            f"{extra[:5]} ({len(missing)} and {len(extra)} files)")
    wrong = []
    for r in rows:
        if from_index(r):
            path = files / r["path"]
            if not path.is_file():
                wrong.append(f"{r['path']}: absent")
            elif sha256(path) != r["sha256"]:
                wrong.append(f"{r['path']}: sha256 {sha256(path)} is not the recorded {r['sha256']}")
    if wrong:
        raise AssembleError("index files differ from the record: " + "; ".join(wrong))
    if out.exists():
        raise AssembleError(f"{out} exists; give a new folder")
    for r in rows:
        source = (files if from_index(r) else base) / r["path"]
        (out / r["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out / r["path"])
    return {"files": len(rows), "from_index": sorted(r["path"] for r in rows if from_index(r)),
            "out": str(out)}


def add_arguments(parser) -> None:
    parser.add_argument("--base", type=Path, required=True, help="the base tree (export_tree of the base commit)")
    parser.add_argument("--files", type=Path, required=True, help="the index files, at their paths in the tree")
    parser.add_argument("--out", type=Path, help="where to write the assembled tree (a new folder)")
    parser.add_argument("--provenance", type=Path, default=DEFAULT_PROVENANCE)
    parser.add_argument("--record", type=Path, metavar="SOURCES",
                        help="write --provenance from --base and --files; SOURCES is a JSON {path: commit}")
    parser.add_argument("--base-commit")
    parser.add_argument("--base-version", default="0.33.0")
    parser.add_argument("--version", default="0.38.1")
    parser.add_argument("--missing-from-base", nargs="*", default=[],
                        help="files of the base commit its mirror lacks (export_tree's second value)")


def run(args, parser=None) -> int:
    if args.record:
        if not args.base_commit:
            raise SystemExit("--record needs --base-commit")
        sources = json.loads(args.record.read_text())
        data = record(args.base, args.files, sources, args.base_commit, args.version, args.base_version,
                      args.missing_from_base)
        results.write_json(data, args.provenance)       # one line per file of the tree
        print(f"{args.provenance}: {len(data['files'])} files, {data['index_files']} from the index")
        return 0
    if not args.out:
        raise SystemExit("give --out (or --record)")
    try:
        done = assemble(args.base, args.files, args.out, json.loads(args.provenance.read_text()))
    except AssembleError as exc:
        print(f"not assembled: {exc}")
        return 1
    print(json.dumps(done, indent=1))
    return 0
