"""The overlay pack is layered one way (docs/architecture.md, "The overlay pack"), keeps its process-wide state in
one module, and carries no measured figure in its runtime strings: every figure a message needs is cited as a key of
the repository's benchmarks/results/, and that key exists. Static checks of the source, as tests/test_layering.py
does for applier/: function-level imports counted.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.test_layering import find_cycle

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "overlays"
RESULTS = REPO / "benchmarks" / "results"

# top to bottom: a module imports modules of its own layer or below, never above
LAYERS = (
    ("node", ("comfyui_fused_dit",)),
    ("api", ("fused_dit",)),
    ("registry", ("fused_dit.registry",)),
    # tiled sampling beside the registry: it wraps ComfyUI's sampling seams and needs no family of the stack below
    ("tiling", ("fused_dit.tiling",)),
    ("integration", ("fused_dit.integration",)),
    ("ops", ("fused_dit.ops",)),
    ("runtime", ("fused_dit.dispatch", "fused_dit.launch", "fused_dit.library")),
    ("state", ("fused_dit.state",)),
    ("data", ("fused_dit.families", "fused_dit.variants", "fused_dit.fingerprint")),
)
# beside the stack: the parity cases and test helpers import ops and the integration; nothing in the product
# imports them
TOOLING = ("fused_dit.parity", "fused_dit.testing")
# function-level imports of pack modules that are not there to dodge a cycle, and why
DEFERRED = {
    ("comfyui_fused_dit", "fused_dit.registry"):
        "the node module loads without torch: applier's node-pack tools read its inputs in a bare interpreter",
    ("comfyui_fused_dit.tiled_sampling", "fused_dit.tiling.wrappers"):
        "the node module loads without torch: applier's node-pack tools read its inputs in a bare interpreter",
    ("comfyui_fused_dit.tiled_vae", "fused_dit.tiling.vae"):
        "the node module loads without torch: applier's node-pack tools read its inputs in a bare interpreter",
    ("comfyui_fused_dit.save_png", "fused_dit.tiling.png"):
        "the node module loads without numpy: applier's node-pack tools read its inputs in a bare interpreter",
    **{(tool, op): "an op module is imported when its case runs: a broken op module fails its own cases only"
       for tool in TOOLING for op in ("fused_dit.ops", "fused_dit.integration", "fused_dit.dispatch")},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(OVERLAYS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def pack_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(OVERLAYS.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, bool, int]]:
    """(pack module imported, at function level, line) for every import statement of `path`; `from X import a`
    counts as an import of X.a where that is a module, else of X."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    function_level = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for node in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in targets:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != here:
                found.append((name, id(node) in function_level, node.lineno))
    return found


def import_graph() -> dict[str, list[tuple[str, bool, int]]]:
    files = pack_files()
    return {name: imports_of(path, set(files)) for name, path in files.items()}


def layer_of(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p != "fused_dit" and module.startswith(p + ".")) for p in prefixes):
            return index
    return None


# ------------------------------------------------------------------------------------------------ layers
def test_every_pack_module_has_a_layer_or_is_tooling():
    unplaced = [m for m in pack_files() if layer_of(m) is None and m not in TOOLING]
    assert not unplaced, unplaced


def test_the_pack_has_no_import_cycle_function_level_imports_included():
    graph = {module: {target for target, _, _ in found} for module, found in import_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_imports_go_down_the_layers_only():
    upward = []
    for module, found in import_graph().items():
        if module in TOOLING:
            continue
        for target, _, line in found:
            if target in TOOLING:
                upward.append(f"{module}:{line} imports the tooling module {target}")
            elif layer_of(target) < layer_of(module):
                upward.append(f"{module}:{line} ({LAYERS[layer_of(module)][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "\n".join(upward)


def test_tooling_reaches_no_higher_than_the_integration():
    for tool in TOOLING:
        for target, _, line in import_graph()[tool]:
            assert target in TOOLING or layer_of(target) >= layer_of("fused_dit.integration"), (tool, line, target)


def test_no_pack_module_is_imported_inside_a_function_but_for_a_stated_reason():
    hidden = []
    for module, found in import_graph().items():
        for target, function_level, line in found:
            allowed = any(module == m and (target == t or target.startswith(t + ".")) for m, t in DEFERRED)
            if function_level and not allowed:
                hidden.append(f"{module}:{line} imports {target} inside a function")
    assert not hidden, "\n".join(hidden)


def test_the_architecture_page_shows_the_packs_layers():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## The overlay pack"):]
    for name, prefixes in LAYERS:
        assert f"{name}:" in section, name
        for prefix in prefixes:
            path = prefix.replace(".", "/")
            assert path.split("/", 1)[-1] in section or path in section, (name, prefix)


# ------------------------------------------------------------------------------------------------ state
def _module_level_assignments(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            yield node


def _is_counter_or_set(value: ast.AST) -> bool:
    """set(), a set literal, or a one-number list (a counter kept in a list)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "set":
        return True
    if isinstance(value, ast.Set):
        return True
    return isinstance(value, ast.List) and len(value.elts) <= 1 and all(
        isinstance(e, ast.Constant) and isinstance(e.value, int) for e in value.elts)


def test_process_wide_sets_counters_and_records_live_in_state_only():
    kept = []
    for module, path in pack_files().items():
        if module == "fused_dit.state":
            continue
        for node in _module_level_assignments(ast.parse(path.read_text(encoding="utf-8"))):
            if _is_counter_or_set(node.value):
                kept.append(f"{module}:{node.lineno}")
    assert not kept, "module-level sets or counters outside state.py: " + ", ".join(kept)


def test_a_variants_fingerprint_sets_are_replaced_never_edited():
    from fused_dit import state
    spec = state.all_variants()["linear_fp8_seam"]
    with pytest.raises(TypeError):
        spec.verified_on["edited"] = {}
    state.add_verified("linear_fp8_seam", "layering test", {})
    try:
        assert "layering test" not in spec.verified_on
        assert "layering test" in state.all_variants()["linear_fp8_seam"].verified_on
    finally:
        state.remove_verified("linear_fp8_seam", "layering test")


# ------------------------------------------------------------------------------------------------ figures
FIGURE = re.compile(r"(?<![\w.%])\d+(?:\.\d+)?x\b"
                    r"|(?<![\w.%])\d+(?:\.\d+)?\s?(?:ms|us|s/step|GiB|MiB|GB/s|TFLOP/s|TFLOPS|%)(?!\w)")
CITATION = re.compile(r"see benchmarks/results/([\w.-]+\.json): ([A-Za-z_][\w.]*(?:\[[^\]]*\])?)")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def runtime_strings(path: Path):
    """(line, text) of every string constant of `path` but its docstrings (f-strings' literal parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def variants_strings():
    data = json.loads((OVERLAYS / "fused_dit" / "variants.json").read_text(encoding="utf-8"))
    for name, spec in data["variants"].items():
        for key in ("about", "off_because"):
            if key in spec:
                yield f"variants.json {name}.{key}", spec[key]


def test_no_measured_figure_in_the_packs_runtime_strings():
    found = [f"{path.relative_to(REPO)}:{line}: {match.group(0)!r} in {text[:80]!r}"
             for path in pack_files().values() for line, text in runtime_strings(path)
             for match in FIGURE.finditer(text)]
    found += [f"{where}: {match.group(0)!r}" for where, text in variants_strings() for match in FIGURE.finditer(text)]
    assert not found, "\n".join(found)


def test_no_measured_figure_in_the_overlay_tests_assertions():
    found = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                for constant in ast.walk(node):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str) \
                            and FIGURE.search(constant.value):
                        found.append(f"{path.name}:{node.lineno}: {constant.value[:80]!r}")
    assert not found, "\n".join(found)


def resolve(data, key: str):
    """The part of a results file a citation key names: `a.b` walks dicts; `runs[k=v|w, ...]` keeps the list items
    whose fields match (at least one must)."""
    for part in re.findall(r"[^.\[]+(?:\[[^\]]*\])?", key):
        name, _, filters = part.partition("[")
        data = data[name.strip()]
        if filters:
            wanted = [f.split("=", 1) for f in filters.rstrip("]").split(", ")]
            data = [item for item in data
                    if all(str(item.get(k)) in v.split("|") for k, v in wanted)]
            assert data, f"no entry of {name} matches [{filters}"
    return data


def citations():
    from fused_dit import families
    from fused_dit.ops import adaln, gate_add, quantize_fp8, rms_rope
    for path in pack_files().values():
        for line, text in runtime_strings(path):
            for match in CITATION.finditer(text):
                yield f"{path.name}:{line}", match.group(1), match.group(2)
    for where, text in variants_strings():
        for match in CITATION.finditer(text):
            yield where, match.group(1), match.group(2)
    for name, value in vars(families).items():
        if isinstance(value, families.Evidence):
            yield f"families.{name}", value.file, value.key
    for record in (adaln.TUNING, gate_add.TUNING, quantize_fp8.TUNING, rms_rope.FLUX_TUNING, rms_rope.WAN_TUNING):
        file, _, keys = record.results.partition(": ")
        for key in keys.split(", "):
            yield f"TuningRecord {record.chosen[:30]}", file, key


@pytest.mark.skipif(not RESULTS.is_dir(), reason="benchmarks/results/ is not in this checkout")
def test_every_results_key_a_message_cites_exists():
    cited = list(citations())
    assert len({where for where, _, _ in cited}) >= 8
    for where, file, key in cited:
        resolve(json.loads((RESULTS / file).read_text(encoding="utf-8")), key)


def test_a_citation_key_that_is_not_there_is_caught():
    with pytest.raises((KeyError, AssertionError)):
        resolve({"runs": [{"model": "flux-dev"}]}, "runs[model=wan]")
    with pytest.raises(KeyError):
        resolve({"rope": {}}, "rope_seam_on_gpu")
