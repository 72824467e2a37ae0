"""The applier package is layered one way: no import cycle, function-level imports counted, and nothing below the
CLI prints."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "applier"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every applier module path imports, wherever the import statement sits (module level or in a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != here and name != "applier":
                out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_applier_has_no_import_cycle_function_level_imports_included():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_confinement_knows_neither_the_catalog_nor_the_overlay_pack():
    graph = import_graph()
    assert graph["applier.confine"] <= {"applier.errors", "applier.paths", "applier.heldroot", "applier.fsutil"}


def test_the_state_folder_layer_does_not_reach_up():
    graph = import_graph()
    above = {"applier.journal", "applier.operations", "applier.overlays", "applier.status", "applier.planner",
             "applier.allowlist", "applier.cli", "applier.catalog"}
    for low in ("applier.fsutil", "applier.confine", "applier.state", "applier.lock"):
        assert not graph[low] & above, (low, graph[low] & above)
    assert not graph["applier.journal"] & (above - {"applier.journal"})


def test_every_module_says_what_it_owns_in_its_first_docstring_line():
    for path in PACKAGE.rglob("*.py"):
        if "_data" in path.parts or path.name == "__main__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc and doc.splitlines()[0].strip(), f"{path.name} has no docstring"


def test_nothing_below_the_cli_prints():
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("cli.py",) or "_data" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                assert name not in ("print", "echo", "secho"), f"{path.name}:{node.lineno} prints"
