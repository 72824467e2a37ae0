"""Fingerprints of upstream code: the sha256 of a function's or class's normalised source (stdlib only, no torch).

One normaliser serves both sides of the overlay's version check, so that they can never disagree about what "the
same code" means:
- the ComfyUI node at run time fingerprints the objects the loaded model really calls (`of_object`, through
  `inspect.getsource`);
- `applier overlay check` reads the target's ComfyUI files without importing them (`of_definition`, through `ast`),
  loading this file by path.

Normalised means parsed with `ast`, docstrings dropped (comments and formatting never reach the tree), positions
left out, then written out by `stable_dump`: reformatting or re-commenting upstream code keeps its fingerprint, any
change to what it does (a new statement, another name, another constant) changes it. Not `ast.dump`, whose text
changes with the Python that runs it (3.12 adds `type_params=[]` to every def, 3.13 leaves empty fields out): a
ComfyUI on Python 3.12 must match fingerprints recorded on 3.11. `stable_dump` writes each node's type and its
fields that hold something, leaving out empty lists, None, and the `ctx` / `kind` / `type_comment` fields. A definition is the node itself (decorators
included), so a method fingerprints the same whether it is read from its file or from its live function.

A name that is not bound by exactly one `def` or `class` in its module (an assignment, an import, several bindings
under try/except) has no fingerprint: `of_definition` returns None with the reason in `unresolved`, and no verified
variant can depend on it.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_SCOPES = (ast.Module, *_DEFINITIONS)


def _drop_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, _SCOPES) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


_SKIPPED_FIELDS = frozenset({"ctx", "kind", "type_comment", "type_params"})


def stable_dump(node) -> str:
    """The tree as text that is the same on every Python this pack supports (3.10 to 3.14)."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if name in _SKIPPED_FIELDS or value is None or value == []:
                continue
            fields.append(f"{name}={stable_dump(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(stable_dump(item) for item in node) + "]"
    return repr(node)


def of_node(node: ast.AST) -> str:
    """sha256 (hex) of one parsed definition, normalised."""
    dumped = stable_dump(_drop_docstrings(node))
    return hashlib.sha256(dumped.encode("utf-8")).hexdigest()


def of_source(source: str) -> str:
    """sha256 of the single definition in `source` (e.g. what inspect.getsource returns; indentation is removed)."""
    body = ast.parse(textwrap.dedent(source)).body
    if len(body) != 1 or not isinstance(body[0], _DEFINITIONS):
        raise ValueError("the source does not hold exactly one def or class")
    return of_node(body[0])


def of_object(obj) -> str:
    """sha256 of a live function, method or class's source; raises OSError/TypeError/ValueError when it has none."""
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    return of_source(inspect.getsource(obj))


class Unresolved(LookupError):
    """A qualified name that does not lead to one def/class in a module's source."""


def find_definition(module_source: str, qualname: str) -> ast.AST:
    """The def/class node that `qualname` ("Block.forward", "apply_rope") names in a module's source text.

    Only definitions made at the top of a module or class body count (not inside if/try), and a name bound more
    than once, or bound by anything else than def/class, is Unresolved: such code is not one thing the overlay can
    have been verified against.
    """
    scope: ast.AST = ast.parse(module_source)
    walked = []
    for part in qualname.split("."):
        walked.append(part)
        bindings = list(bindings_of(scope, part))
        if not bindings:
            raise Unresolved(f"{'.'.join(walked)} is not defined")
        if len(bindings) > 1 or not isinstance(bindings[0], _DEFINITIONS):
            kinds = ", ".join(type(node).__name__ for node in bindings)
            raise Unresolved(f"{'.'.join(walked)} is bound by {kinds}, not by one def/class")
        scope = bindings[0]
    return scope


def bindings_of(scope: ast.AST, name: str):
    """Every statement of a module or class body, nested blocks included, that binds `name`."""
    pending = list(getattr(scope, "body", []))
    while pending:
        node = pending.pop(0)
        if isinstance(node, _DEFINITIONS):
            if node.name == name:
                yield node
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for target in targets for t in ast.walk(target)):
                yield node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            pending.extend(getattr(node, field, []) or [])


def of_definition(module_source: str, qualname: str) -> str:
    """sha256 of `qualname` as defined in a module's source text; raises Unresolved (or SyntaxError)."""
    return of_node(find_definition(module_source, qualname))
