"""Section 6, the fuzzer: hypothesis mutates real catalog TOML (every shipped patch.toml) and real state.json,
journal.json and overlays.json files (type swaps, deleted and added keys, hostile paths, raw byte damage), then runs a
command on the install in this process (Click's runner). Every run must end with a documented exit code, print no
traceback and no "internal error", leave no temp file, and never touch the canary file outside the install.

APPLIER_FUZZ_EXAMPLES sets the examples per target (default 100; 10,000 or more for a long run)."""
from __future__ import annotations

import json
import math
import os
import shutil
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reltools import (DOCUMENTED, REPO, assert_clean, cli, fork_cli, make_install, problems_of, record_figure,
                      restore, stash, strays, wait_exit)
from tests.fixtures.comfy_tree import build_comfy_tree

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("APPLIER_FUZZ_EXAMPLES", "100"))
# No shrinking unless asked for (APPLIER_FUZZ_SHRINK=1): each shrink step is a command run, and on a broken product
# shrinking four targets takes many minutes; the failing file is printed whole instead.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("APPLIER_FUZZ_SHRINK")
                                                          else [])
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True, phases=PHASES,
                suppress_health_check=list(HealthCheck))
CANARY = b"canary = 'must never change'\n"

# strings an attacker or a clumsy editor would put where a path, a name or a hash belongs
HOSTILE = ["", ".", "..", "../x", "../../x", "/", "/etc/passwd", "@CANARY_ABS@", "@CANARY_REL@", "nodes.py",
           "nodes.py/", "./nodes.py", "execution.py", "custom_nodes", ".applier", ".applier/state.json",
           "backups/../../x", "journal-data/../../../x", "0000.new", "comfyui", "site-packages", "torch", "evil",
           "comfyui/maxres", "fused_dit/__init__.py", "fused_dit", "C:\\Windows\\x", "nodes.py\x00", "~/x",
           "a" * 300, ">=0", "<0.0.1", "all", "16384-era.diff", "../16384-era.diff", "é", "\ud800"]
KEYS = ["path", "relpath", "root", "backup", "format", "files", "applied", "sha256", "sha256_before",
        "sha256_after", "old_sha256", "new_sha256", "old_bytes", "new_bytes", "like", "state_after", "seq",
        "variant", "name", "versions", "diff", "tested", "default", "title", "shared", "requires",
        "requires_text", "installing", "pack", "package", "node", "component", "mode", "fuzz", "prune"]

leaves = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64), st.floats(), st.text(max_size=12),
                   st.sampled_from(HOSTILE), st.builds(list), st.builds(dict),
                   st.lists(st.sampled_from(HOSTILE), max_size=3))


# ------------------------------------------------------------------------------------------ mutations

def paths_in(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key in doc:
            yield from paths_in(doc[key], prefix + (key,))
    elif isinstance(doc, list):
        for i, item in enumerate(doc):
            yield from paths_in(item, prefix + (i,))


def get(doc, path):
    for step in path:
        doc = doc[step]
    return doc


def mutate(data, doc):
    """1-4 structural edits of a parsed document, drawn by hypothesis."""
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        path = data.draw(st.sampled_from(list(paths_in(doc))), label="at")
        op = data.draw(st.sampled_from(["replace", "delete", "add", "wrap", "path-edit", "duplicate"]), label="op")
        node = get(doc, path)
        parent = get(doc, path[:-1]) if path else None
        if op == "replace" or (op == "delete" and not path):
            value = data.draw(leaves, label="value")
            if path:
                parent[path[-1]] = value
            else:
                doc = value
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add" and isinstance(node, dict):
            node[data.draw(st.sampled_from(KEYS), label="key")] = data.draw(leaves, label="value")
        elif op == "add" and isinstance(node, list):
            node.append(data.draw(leaves, label="value"))
        elif op == "wrap":
            wrapped = data.draw(st.sampled_from(["list", "dict"]), label="wrap")
            value = [node] if wrapped == "list" else {"x": node}
            if path:
                parent[path[-1]] = value
            else:
                doc = value
        elif op == "path-edit" and isinstance(node, str) and path:
            parent[path[-1]] = data.draw(st.sampled_from(["../", "/", "./", "..\\", "backups/", "x/../../"]),
                                         label="prefix") + node
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(json.loads(json.dumps(node)))
    return doc


def damage(data, raw: bytes) -> bytes:
    """Byte-level damage: truncation, a stray byte (non-UTF-8 among them), a dropped or repeated line."""
    how = data.draw(st.sampled_from(["truncate", "insert", "drop-line", "repeat-line"]), label="damage")
    at = data.draw(st.integers(0, max(len(raw) - 1, 0)), label="offset")
    if how == "truncate":
        return raw[:at]
    if how == "insert":
        return raw[:at] + data.draw(st.sampled_from([b"\xff", b"\x00", b"\xc3", b"[", b"\"", b"\n", b"}"]),
                                    label="byte") + raw[at:]
    lines = raw.splitlines(keepends=True) or [b""]
    i = at % len(lines)
    return b"".join(lines[:i] + ([] if how == "drop-line" else [lines[i], lines[i]]) + lines[i + 1:])


def fill(text: str, install) -> str:
    return (text.replace("@CANARY_ABS@", str(install.canary))
            .replace("@CANARY_REL@", os.path.relpath(install.canary, install.comfy)))


# ------------------------------------------------------------------------------------------ a tiny TOML writer

def toml_key(key) -> str:
    return json.dumps(str(key))


def toml_value(value) -> str | None:
    if value is None:
        return None                                     # TOML has no null: the key is left out
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(v for v in map(toml_value, value) if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {v}" for k, v in ((k, toml_value(x)) for k, x in value.items())
                               if v is not None) + "}"
    return json.dumps(str(value))


def to_toml(doc) -> str:
    if not isinstance(doc, dict):
        doc = {"value": doc}
    lines, tables = [], []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                tables += ["", f"[[{toml_key(key)}]]"]
                tables += [f"{toml_key(k)} = {v}" for k, v in ((k, toml_value(x)) for k, x in item.items())
                           if v is not None]
        elif isinstance(value, dict):
            tables += ["", f"[{toml_key(key)}]"]
            tables += [f"{toml_key(k)} = {v}" for k, v in ((k, toml_value(x)) for k, x in value.items())
                       if v is not None]
        elif (text := toml_value(value)) is not None:
            lines.append(f"{toml_key(key)} = {text}")
    return "\n".join(lines + tables) + "\n"


def test_the_toml_writer_round_trips_the_shipped_catalog():
    for path in sorted((REPO / "patches").glob("*/*/patch.toml")):
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
        assert tomllib.loads(to_toml(doc)) == doc, path


# ------------------------------------------------------------------------------------------ installs to fuzz

class Fuzzed:
    """A base install, stashed; each example puts it back, writes one mutated file and runs one command."""

    def __init__(self, folder: Path, kind: str):
        self.kind = kind
        self.canary = folder / "outside" / "canary.py"
        self.canary.parent.mkdir(parents=True)
        self.canary.write_bytes(CANARY)
        self.runs = self.failures = 0
        self.codes: dict[int, int] = {}
        if kind == "catalog":
            self.root = self.comfy = build_comfy_tree(folder / "ComfyUI", era="latest", layout="plain")
            self.catalog = folder / "patches-copy"
            shutil.copytree(REPO / "patches", self.catalog)
            self.seeds = sorted(self.catalog.glob("*/*/patch.toml"))
        else:
            inst = make_install(folder / "t", layout="portable" if kind == "manifest" else "plain")
            self.root, self.comfy, self.catalog = inst.root, inst.comfy, inst.catalog
            if kind == "state":
                assert_clean(cli(*inst.args("apply")), allowed=(0,))
                self.seeds = [self.root / ".applier" / "state.json"]
            elif kind == "journal":
                code = wait_exit(fork_cli(*inst.args("apply"), env={"APPLIER_FAILPOINT": "after-first-file"}))
                assert code == 77
                self.seeds = [self.root / ".applier" / "journal.json"]
            else:
                assert_clean(cli(*inst.args("overlay", "install")), allowed=(0,))
                self.seeds = [self.root / ".applier" / "overlays.json"]
        self.saved = stash(self.root, folder / "saved")
        self.originals = {p: p.read_bytes() for p in self.seeds}

    def args(self, *command):
        return (*command, "--target", self.root, "--patches", self.catalog)

    def reset(self):
        if self.kind == "catalog":
            for path, data in self.originals.items():
                path.write_bytes(data)
        restore(self.root, self.saved)


COMMANDS = {
    "catalog": [("list",), ("status",), ("apply", "--dry-run"), ("explain",)],
    "state": [("status",), ("list",), ("revert",), ("apply",), ("revert", "--dry-run")],
    "journal": [("status",), ("list",), ("revert",), ("apply",), ("overlay", "list")],
    "manifest": [("overlay", "list"), ("overlay", "uninstall"), ("overlay", "install"), ("status",)],
}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = Fuzzed(tmp_path_factory.mktemp(f"fuzz-{kind}"), kind)
        return made[kind]
    yield get
    for kind, f in made.items():
        record_figure("fuzz", target=kind, runs=f.runs, failed=f.failures, max_examples=EXAMPLES,
                      exit_codes={str(k): v for k, v in sorted(f.codes.items())})


def one_example(f: Fuzzed, data) -> None:
    f.reset()
    seed = data.draw(st.sampled_from(f.seeds), label="file")
    raw = f.originals[seed]
    doc = tomllib.loads(raw.decode()) if f.kind == "catalog" else json.loads(raw)
    doc = mutate(data, doc)
    text = to_toml(doc) if f.kind == "catalog" else json.dumps(doc, indent=2)
    body = fill(text, f).encode("utf-8", "surrogatepass")
    if data.draw(st.integers(0, 9), label="raw damage?") == 0:
        body = damage(data, body)
    seed.write_bytes(body)
    command = data.draw(st.sampled_from(COMMANDS[f.kind]), label="command")
    if command == ("explain",):
        args = ("explain", f"{seed.parent.parent.name}/{seed.parent.name}", "--patches", f.catalog)
    else:
        args = f.args(*command)
    f.runs += 1
    out = cli(*args)
    f.codes[out.code] = f.codes.get(out.code, 0) + 1
    problems = problems_of(out, allowed=DOCUMENTED)
    if f.canary.read_bytes() != CANARY:
        problems.append("the canary outside the install changed")
    if strays(f.root):
        problems.append(f"temp files left: {strays(f.root)}")
    if problems:
        f.failures += 1
        raise AssertionError(f"{', '.join(problems)}\n--- {seed.name} was:\n{body[:3000]!r}\n{out}")


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_fuzzed_files_end_with_a_documented_exit_code(fuzzed, kind):
    f = fuzzed(kind)

    @FUZZ
    @given(st.data())
    def run_examples(data):
        one_example(f, data)

    try:
        run_examples()
    finally:
        f.reset()
