"""The applier package is layered one way: its subpackages are the layers (LAYERS), imports run down only between
them, no import cycle anywhere, function-level imports counted, and nothing below the CLI prints."""
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


# applier/'s layers, top to bottom (docs/architecture.md): a module imports its own group or a lower layer, never
# a group of its own layer or above. A group is a subpackage or a top-level module; the small shared modules are one
# group, the leaves, and import only each other.
LAYERS = (
    ("entry", ("applier.__main__",)),
    ("cli", ("applier.cli",)),
    ("commands", ("applier.operations", "applier.status", "applier.detect")),
    ("installers", ("applier.pack", "applier.budget")),
    ("catalog", ("applier.catalog",)),
    ("diff engine", ("applier.diffengine",)),
    ("store", ("applier.store",)),
    ("leaves", ("applier.errors", "applier.settings", "applier.subproc", "applier.resources", "applier.target",
                "applier.strenum")),
)
LEAVES = LAYERS[-1][1]


def group_of(module: str) -> tuple[int, str] | None:
    """(layer index, group) of an applier module: its subpackage or top-level module, the leaves as one group."""
    for index, (_, groups) in enumerate(LAYERS):
        for group in groups:
            if module == group or module.startswith(group + "."):
                return index, "leaves" if group in LEAVES else group
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in sorted(graph.items()):
        here = group_of(module)
        for other in sorted(imported):
            there = group_of(other)
            if here is None or there is None:
                continue
            if there[1] != here[1] and there[0] <= here[0]:
                wrong.append(f"{module} imports {other} ({LAYERS[here[0]][0]} -> {LAYERS[there[0]][0]})")
    return wrong


def test_every_applier_module_sits_in_a_layer():
    graph = import_graph()
    assert [m for m in graph if m != "applier" and group_of(m) is None] == []


def test_the_layer_check_finds_a_planted_upward_import():
    assert upward_imports({"applier.store.lock": {"applier.catalog.planner"}})
    assert upward_imports({"applier.operations": {"applier.status"}})      # one layer, two groups: no import
    assert upward_imports({"applier.settings": {"applier.store.failpoints"}})
    assert not upward_imports({"applier.catalog.planner": {"applier.catalog", "applier.store.paths",
                                                           "applier.diffengine.model", "applier.errors"}})


def test_imports_run_one_way_between_the_layers():
    assert upward_imports(import_graph()) == []


def test_every_subpackage_is_a_layer_folder():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    named = {g.split(".")[1] for _, groups in LAYERS for g in groups if (PACKAGE / g.split(".")[1]).is_dir()}
    assert folders - {"_data"} == named


def test_confinement_knows_neither_the_catalog_nor_the_overlay_pack():
    graph = import_graph()
    assert graph["applier.store.confine"] <= {"applier.errors", "applier.store.paths", "applier.store.heldroot",
                                              "applier.store.fsutil"}


def test_the_state_folder_layer_does_not_reach_up():
    graph = import_graph()
    for low in ("applier.store.fsutil", "applier.store.confine", "applier.store.state", "applier.store.lock"):
        assert "applier.store.journal" not in graph[low], low


def test_every_module_says_what_it_owns_in_its_first_docstring_line():
    for path in PACKAGE.rglob("*.py"):
        if "_data" in path.parts or path.name == "__main__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc and doc.splitlines()[0].strip(), f"{path.name} has no docstring"


def test_nothing_below_the_cli_prints():
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "cli" or "_data" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                assert name not in ("print", "echo", "secho"), f"{path.name}:{node.lineno} prints"


def test_a_packages_init_hands_names_on():
    """A package's __init__.py defines nothing and holds at most 60 lines of code: the code lives in named modules."""
    for init in PACKAGE.rglob("__init__.py"):
        if "_data" in init.parts:
            continue
        tree = ast.parse(init.read_text(encoding="utf-8"))
        defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        assert defined == [], f"{init.relative_to(PACKAGE)} defines {defined}"
        docstring = tree.body[0].end_lineno if tree.body and isinstance(tree.body[0], ast.Expr) else 0
        code = [line for line in init.read_text(encoding="utf-8").splitlines()[docstring:]
                if line.strip() and not line.strip().startswith("#")]
        assert len(code) <= 60, f"{init.relative_to(PACKAGE)}: {len(code)} lines of code"
