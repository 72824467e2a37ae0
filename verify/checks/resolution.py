"""max-resolution and resolution-caps: what the tree (and, on request, the running ComfyUI) allows as image size.

Both read source files statically with `ast` (never importing them): nodes.py's `MAX_RESOLUTION`, and the
hard-coded caps in comfy_extras/ and custom_nodes/ that a raised MAX_RESOLUTION does not reach. Every read is
bounded, of regular files only and of files that really lie inside the ComfyUI folder (applier.store.fsutil.read_inside):
the caps scan skips, with a WARN naming each, a FIFO, a device (a link to /dev/zero), a file over
MAX_SCANNED_FILE_BYTES and a link leading outside the ComfyUI folder (comfy_extras/ or custom_nodes/ itself being
one included); it never blocks on one nor follows a link out. The walk of custom_nodes/ is bounded and not
recursive: MAX_SCAN_DEPTH folders deep, MAX_SCAN_ENTRIES names listed, MAX_SCANNED_FILES files read; a bound
reached makes the check a WARN naming it (caps past it were not looked for).
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from applier.errors import ApplierError
from applier.store.fsutil import FileTooLarge, LeadsOutside, NotRegularFile, read_inside
from applier.store.paths import real_inside

from ..registry import CheckResult, Outcome, check

# The probe that imports the target's nodes.py and reports MAX_RESOLUTION and EmptyLatentImage's width max.
COMFY_IMPORT_PROBE = "comfy_import"

# Folders never scanned for caps: other environments, caches, VCS data, the applier's own state.
SKIPPED_DIRS = frozenset({".git", ".hg", "__pycache__", ".applier", "venv", ".venv", "env", "node_modules",
                          "site-packages", "dist-packages", ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
MAX_SCANNED_FILE_BYTES = 4 * 1024 * 1024     # larger .py files are generated data, not node definitions
MAX_NODES_PY_BYTES = 16 * 1024 * 1024        # nodes.py is ~100 kB
MAX_SKIPPED_LISTED = 5
# Bounds of the caps scan: a node pack's code sits a few folders deep in a few hundred files; a tree far past these
# (a dataset, a million generated files) is not node code, and walking it took minutes.
MAX_SCAN_DEPTH = 16              # folders below custom_nodes/
MAX_SCAN_ENTRIES = 200_000       # names listed, files and folders alike
MAX_SCANNED_FILES = 20_000       # .py files read
# Expressions deeper than this are not a resolution constant (and evaluating them recursively could overflow).
MAX_EXPRESSION_DEPTH = 32
OUTSIDE = "a link leading outside the ComfyUI folder"
# Inputs whose names say they are an image dimension.
DIMENSION_INPUT = re.compile(r"width|height|resolution", re.IGNORECASE)
# A "max" below this on a width/height input is a line or border thickness, not an image size.
MIN_PLAUSIBLE_CAP = 256
# Cheap byte searches decide which files are worth parsing. A cap is an integer constant expression (int_value):
# after `"max":` / `max=` (with a dimension word in the text just before it) or after the `=` of an assignment to a
# name ending in MAX_RESOLUTION, it starts with a digit, maybe inside parentheses; a name (`nodes.MAX_RESOLUTION`)
# or a float is never one. Where the first number stands alone (no operator after it) its value must be a cap below
# the size asked for; where an operator follows, the file is parsed. Each pattern starts with a literal (fast in `re`).
_QUICK_MAX = re.compile(rb"max[\"']?\s*[:=][\s(]*(\d[\w.]*)\s*(\S?)")
_QUICK_DEFINITION = re.compile(rb"MAX_RESOLUTION(?:[^\n]|\\\n)*?=[\s(]*(\d[\w.]*)\s*(\S?)")
_OPERATOR_START = frozenset(b"*+-/<%")
_DIMENSION_WORDS = (b"width", b"height", b"resolution")
_LOOKBACK_BYTES = 400     # an input's name and its options dict sit within a few lines of its "max"
_REGEX_DEFINITION = re.compile(r"^\s*(?:[\w.]*\.)?(\w*MAX_RESOLUTION)\s*(?::\s*[\w.]+\s*)?=\s*(\d+)\s*(?:#.*)?$")
_REGEX_INPUT_MAX = re.compile(
    r"[\"'](\w*(?:width|height|resolution)\w*)[\"']\s*[:,].*?[\"']max[\"']\s*:\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class MaxResolution:
    value: int | None     # None: no definition found
    line: int | None
    how: str              # "ast" | "regex" (nodes.py did not parse with this Python)


@dataclass(frozen=True)
class Cap:
    file: str             # relative to the ComfyUI root, "/" separators
    line: int
    value: int
    what: str             # "MAX_RESOLUTION" definition or the input's name
    node: str = ""        # the class the cap stands in (a node's INPUT_TYPES / define_schema), "" at module level

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.value}"


@dataclass
class CapScan:
    caps: list[Cap] = field(default_factory=list)
    files_scanned: int = 0
    files_parsed_by_regex: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (relative path, why) of files not read
    limits: list[str] = field(default_factory=list)    # each bound the scan reached, in words: what was left out

    def reach(self, limit: str) -> None:
        if limit not in self.limits:
            self.limits.append(limit)


# ---------------------------------------------------------------- reading source

def int_value(node: ast.AST, depth: int = 0) -> int | None:
    """The value of an integer constant expression (`16384`, `8192 * 2`, `1 << 14`), None for anything else,
    one nested more than MAX_EXPRESSION_DEPTH deep included."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and depth < MAX_EXPRESSION_DEPTH:
        left, right = int_value(node.left, depth + 1), int_value(node.right, depth + 1)
        if left is None or right is None:
            return None
        if isinstance(node.op, (ast.Pow, ast.LShift)):
            # Resolutions are small: refusing huge exponents keeps a hostile file from stalling the scan.
            return (left ** right if isinstance(node.op, ast.Pow) else left << right) if 0 <= right <= 64 else None
        if isinstance(node.op, ast.FloorDiv):
            return left // right if right else None
        ops = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}
        return ops.get(type(node.op))
    return None


def _assigned_names(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = []
    for target in targets:
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, ast.Attribute):
            names.append(target.attr)   # `nodes.MAX_RESOLUTION = 8192`: a custom node overriding the global
    return names


def read_max_resolution(nodes_py: Path) -> MaxResolution:
    """The module-level MAX_RESOLUTION of nodes.py (the last assignment wins, as at import). Handles a BOM, CRLF,
    `MAX_RESOLUTION=16384` and `MAX_RESOLUTION: int = 16384`. OSError when the file cannot be read, IOFailure
    when it is not a regular file, is too large or is a link leading out of its folder (the ComfyUI folder)."""
    data = read_inside(Path(nodes_py).parent, nodes_py, limit=MAX_NODES_PY_BYTES)
    try:
        tree = ast.parse(data, filename=str(nodes_py))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # A nodes.py written for a newer Python than the applier's still has a plain assignment line.
        found = MaxResolution(None, None, "regex")
        for number, line in enumerate(_decode(data).splitlines(), start=1):
            match = re.match(r"^MAX_RESOLUTION\s*(?::\s*[\w.]+\s*)?=\s*(\d+)\s*(?:#.*)?$", line)
            if match:
                found = MaxResolution(int(match.group(1)), number, "regex")
        return found
    found = MaxResolution(None, None, "ast")
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                and "MAX_RESOLUTION" in _assigned_names(node):
            found = MaxResolution(int_value(node.value), node.lineno, "ast")
    return found


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig", errors="replace")


def _input_name(call: ast.Call) -> str | None:
    """The input name of a v3 schema call such as `io.Int.Input("width", min=16, max=16384)`."""
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    for keyword in call.keywords:
        if keyword.arg in ("id", "name") and isinstance(keyword.value, ast.Constant) \
                and isinstance(keyword.value.value, str):
            return keyword.value.value
    return None


def _max_in_options(node: ast.AST) -> tuple[int, int] | None:
    """(value, line) of a literal "max" in an input's options dict: ("INT", {"min": 16, "max": 8192})."""
    if not isinstance(node, (ast.Tuple, ast.List)):
        return None
    for element in node.elts:
        if isinstance(element, ast.Dict):
            for key, value in zip(element.keys, element.values):
                if isinstance(key, ast.Constant) and key.value == "max":
                    number = int_value(value)
                    if number is not None:
                        return number, value.lineno
    return None


def caps_in_source(data: bytes, relpath: str, cap: int) -> tuple[list[Cap], bool]:
    """The caps below `cap` in one file's source, and whether the regex fallback had to be used. Only the top-level
    statements a quick pattern points at are parsed (a node file is one class per node: parsing all of them was
    most of `applier budget`'s time); where one of them does not parse alone, the whole file is."""
    statements = candidate_statements(data, cap)
    if statements is not None:
        try:
            found = []
            for first_line, text in statements:      # the blank lines first keep the file's line numbers
                found += _caps_in_tree(ast.parse("\n" * (first_line - 1) + text), relpath, cap)
            return sorted(set(found), key=lambda c: c.line), False
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass                        # a statement cut where it should not be: the whole file below
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):   # deep nesting: the regex reads lines
        return _caps_by_regex(_decode(data), relpath, cap), True
    return sorted(set(_caps_in_tree(tree, relpath, cap)), key=lambda c: c.line), False


_CONTINUES = re.compile(r"(?:else|elif|except|finally)\b|[)\]}#\s]|$")     # a column-0 line that starts no statement


def candidate_statements(data: bytes, cap: int | None) -> list[tuple[int, str]] | None:
    """(first line, text) of each top-level statement holding a place where a quick pattern says a cap below `cap`
    may be, in file order; None where the file cannot be cut so (not UTF-8, or a coding line). A statement starts at
    a column-0 line that is not inside a triple-quoted string, does not continue one (a closing bracket, else,
    except, a comment) and follows no decorator or backslash."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    lines = text.splitlines(keepends=True)
    if any(re.match(r"[ \t\f]*#.*coding[:=]", line) for line in lines[:2]):
        return None
    marks = [m for m in _QUICK_DEFINITION.finditer(data) if _could_be_cap(m, cap)]
    marks += [m for m in _QUICK_MAX.finditer(data) if _could_be_cap(m, cap) and any(
        word in data[max(0, m.start() - _LOOKBACK_BYTES):m.start()].lower() for word in _DIMENSION_WORDS)]
    wanted = sorted({data.count(b"\n", 0, m.start()) + 1 for m in marks})
    if not wanted:
        return []
    starts, in_string, follows_decorator, continued = [], None, False, False
    for number, line in enumerate(lines, start=1):
        if in_string is None and not follows_decorator and not continued and not _CONTINUES.match(line):
            starts.append(number)
        if in_string is None and line[:1] not in (" ", "\t"):
            follows_decorator = line.startswith("@") or (follows_decorator and not line.strip())
        for quote in re.findall(r'"""|\'\'\'', line):     # which triple quote is open at the end of the line
            in_string = quote if in_string is None else (None if quote == in_string else in_string)
        continued = line.rstrip("\r\n").endswith("\\")
    statements, bounds = [], starts + [len(lines) + 1]
    for first, end in zip(bounds, bounds[1:]):
        if any(first <= line < end for line in wanted):
            statements.append((first, "".join(lines[first - 1:end - 1])))
    if wanted[0] < bounds[0]:           # before the first statement (a cut gone wrong): let the whole file decide
        return None
    return statements


def _caps_in_tree(tree: ast.AST, relpath: str, cap: int) -> list[Cap]:
    """The caps below `cap` in a parsed file or top-level statement (line numbers as in the file)."""
    found: list[tuple[int, int, str]] = []
    classes: list[tuple[int, int, str]] = []        # class_spans, gathered in the same walk

    def keep(value: int, line: int, what: str) -> None:
        if MIN_PLAUSIBLE_CAP <= value < cap:
            found.append((line, value, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            classes.append((node.lineno, node.end_lineno or node.lineno, node.name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            if any(name.endswith("MAX_RESOLUTION") for name in _assigned_names(node)):
                value = int_value(node.value)
                if value is not None:
                    keep(value, node.lineno, "MAX_RESOLUTION")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and DIMENSION_INPUT.search(key.value):
                    hit = _max_in_options(value)
                    if hit:
                        keep(hit[0], hit[1], key.value)
        elif isinstance(node, ast.Call):
            name = _input_name(node)
            if name and DIMENSION_INPUT.search(name):
                for keyword in node.keywords:
                    if keyword.arg == "max":
                        value = int_value(keyword.value)
                        if value is not None:
                            keep(value, keyword.value.lineno, name)
    return [Cap(relpath, line, value, what, enclosing_class(classes, line)) for line, value, what in found]


def class_spans(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every class in a parsed file."""
    return [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def enclosing_class(spans: list[tuple[int, int, str]], line: int) -> str:
    """The innermost class holding this line ("" at module level)."""
    inside = [(end - start, name) for start, end, name in spans if start <= line <= end]
    return min(inside)[1] if inside else ""


def _caps_by_regex(text: str, relpath: str, cap: int) -> list[Cap]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        definition = _REGEX_DEFINITION.match(line)
        if definition:
            hits = [("MAX_RESOLUTION", int(definition.group(2)))]
        else:
            hits = [(m.group(1), int(m.group(2))) for m in _REGEX_INPUT_MAX.finditer(line)]
        found += [Cap(relpath, number, value, what) for what, value in hits if MIN_PLAUSIBLE_CAP <= value < cap]
    return found


def worth_parsing(data: bytes, cap: int | None = None) -> bool:
    """Whether a file can hold a cap below `cap` (None: of any size); parsing every file of a comfy_extras/ or a large
    custom_nodes/ takes most of `applier budget`'s time. Never false for a file caps_in_source finds a cap in."""
    if any(_could_be_cap(match, cap) for match in _QUICK_DEFINITION.finditer(data)):
        return True
    for match in _QUICK_MAX.finditer(data):
        window = data[max(0, match.start() - _LOOKBACK_BYTES):match.start()].lower()
        if any(word in window for word in _DIMENSION_WORDS) and _could_be_cap(match, cap):
            return True
    return False


def _could_be_cap(match: re.Match, cap: int | None) -> bool:
    """Whether the number a quick pattern found (its first token, and the character after it) can start a cap."""
    token, after = match.group(1), match.group(2)
    if after and after[0] in _OPERATOR_START:
        return True                     # an expression (`16 * 1024`, `1 << 14`): int_value decides
    if not token.isdigit():             # 8_192, 0x2000: parse; 100.0, 1e4: a float, never a cap
        return not any(c in token for c in b".eE") or token[:2].lower() in (b"0x", b"0b", b"0o")
    return MIN_PLAUSIBLE_CAP <= int(token) and (cap is None or int(token) < cap)


def _python_files(root: Path, recursive: bool, scan: CapScan):
    """The .py entries (files, or links to anything but a folder) of root and, when recursive, of the real folders
    below it, depth first in name order, as os.walk gave them; with an explicit stack, never through a folder link,
    and within the scan's bounds (MAX_SCAN_DEPTH, MAX_SCAN_ENTRIES), each bound reached said in scan.limits."""
    if not root.is_dir():
        return
    stack = [(root, 0)]
    listed = 0
    while stack:
        folder, depth = stack.pop()
        entries = []
        try:
            with os.scandir(folder) as found:
                for entry in found:
                    if listed >= MAX_SCAN_ENTRIES:
                        scan.reach(f"stopped after listing {MAX_SCAN_ENTRIES} entries (MAX_SCAN_ENTRIES)")
                        stack.clear()
                        break
                    listed += 1
                    entries.append(entry)
        except OSError:
            continue
        entries.sort(key=lambda entry: entry.name)
        folders = []
        for entry in entries:
            if _is_folder(entry):
                if recursive and not entry.is_symlink() and entry.name not in SKIPPED_DIRS \
                        and not os.path.isfile(os.path.join(entry.path, "pyvenv.cfg")):
                    folders.append(Path(entry.path))   # another interpreter's environment is not the node's code
            elif entry.name.endswith(".py"):
                yield Path(entry.path)
        if folders and depth >= MAX_SCAN_DEPTH:
            scan.reach(f"folders more than {MAX_SCAN_DEPTH} deep not scanned (MAX_SCAN_DEPTH), the first "
                       f"{folders[0].relative_to(root.parent).as_posix()}/")
            continue
        stack += [(sub, depth + 1) for sub in reversed(folders)]


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def read_scanned(path: Path, inside: Path) -> tuple[bytes | None, str | None]:
    """(the bytes of a scanned file, None) or (None, why it was skipped): a file is read only where it really lies
    inside `inside` (the ComfyUI folder), whatever link leads to it; FIFOs, devices and files over the size cap are
    not read."""
    try:
        return read_inside(inside, path, limit=MAX_SCANNED_FILE_BYTES), None
    except LeadsOutside:
        return None, OUTSIDE
    except FileTooLarge:
        return None, f"larger than {MAX_SCANNED_FILE_BYTES // (1024 * 1024)} MiB"
    except NotRegularFile as exc:
        return None, exc.message.rsplit(": it is ", 1)[-1]
    except FileNotFoundError:
        return None, "gone, or a link to nothing"
    except (OSError, ApplierError) as exc:
        return None, getattr(exc, "strerror", None) or str(exc)


def scan_resolution_caps(comfyui_root: Path, cap: int) -> CapScan:
    """Hard-coded resolution caps below `cap` in comfy_extras/*.py and custom_nodes/**/*.py."""
    scan = CapScan()
    inside = Path(os.path.realpath(comfyui_root))
    sources = [(comfyui_root / "comfy_extras", False), (comfyui_root / "custom_nodes", True)]
    for folder, recursive in sources:
        if os.path.lexists(folder) and not real_inside(inside, folder):
            # comfy_extras/ or custom_nodes/ itself a link leading out: not walked, not read
            scan.skipped.append((folder.relative_to(comfyui_root).as_posix() + "/", OUTSIDE))
            continue
        for path in _python_files(folder, recursive, scan):
            if scan.files_scanned + len(scan.skipped) >= MAX_SCANNED_FILES:
                scan.reach(f"stopped after {MAX_SCANNED_FILES} files (MAX_SCANNED_FILES)")
                break
            relpath = path.relative_to(comfyui_root).as_posix()
            data, why = read_scanned(path, inside)
            if data is None:
                scan.skipped.append((relpath, why))
                continue
            scan.files_scanned += 1
            if not worth_parsing(data, cap):
                continue
            caps, by_regex = caps_in_source(data, relpath, cap)
            scan.caps += caps
            scan.files_parsed_by_regex += by_regex
    return scan


# ---------------------------------------------------------------- checks

def _import_is_slow(ctx) -> bool:
    return ctx.options.real_import


def _import_numbers(numbers: dict) -> tuple[int | None, int | None]:
    """(MAX_RESOLUTION, EmptyLatentImage width max) as the comfy_import probe reports them."""
    def first(*keys):
        for key in keys:
            if isinstance(numbers.get(key), int):
                return numbers[key]
        return None
    return (first("max_resolution", "MAX_RESOLUTION"),
            first("empty_latent_width_max", "EmptyLatentImage_width_max", "width_max"))


@check("max-resolution", "MAX_RESOLUTION in nodes.py; with --real-import also EmptyLatentImage's width max as the "
       "target's ComfyUI sees it", slow=_import_is_slow)
def max_resolution(ctx) -> CheckResult:
    root = ctx.target.comfyui_root
    name = "max-resolution"
    if root is None:
        return CheckResult(name, Outcome.SKIP, "the target has no ComfyUI (no nodes.py)")
    nodes_py = Path(root) / "nodes.py"
    try:
        static = read_max_resolution(nodes_py)
    except OSError as exc:
        return CheckResult(name, Outcome.FAIL, f"cannot read {nodes_py}: {exc.strerror or exc}")
    except ApplierError as exc:   # a FIFO, a device, a file far larger than any nodes.py
        return CheckResult(name, Outcome.FAIL, exc.message)
    patch, patched_value = ctx.max_resolution_patch()
    applied = patch is not None and patch.id in ctx.applied
    where = f"nodes.py:{static.line}" if static.line else "nodes.py"
    numbers = {"nodes_py": static.value, "nodes_py_line": static.line, "read_by": static.how,
               "patch": patch.id if patch else None, "patched_value": patched_value, "applied": applied}

    problems: list[str] = []
    if applied and static.value != patched_value:
        problems.append(f"the state says {patch.id} is applied (MAX_RESOLUTION = {patched_value}) but {where} says "
                        f"{static.value if static.value is not None else 'nothing'}")
    facts = [f"MAX_RESOLUTION = {static.value} ({where})" if static.value is not None
             else "no MAX_RESOLUTION assignment in nodes.py"]

    stderr, duration = "", 0.0
    if ctx.options.real_import:
        probe = ctx.run_probe(COMFY_IMPORT_PROBE, ctx.probe_args(patch))
        stderr, duration = probe.stderr, probe.duration_s
        imported, width_max = _import_numbers(probe.numbers)
        numbers.update({"import_outcome": probe.outcome.value, "import_max_resolution": imported,
                        "empty_latent_width_max": width_max})
        if probe.outcome is Outcome.SKIP:
            facts.append(f"import not checked: {probe.reason}")
        elif width_max is None:
            problems.append(f"importing the target's ComfyUI gave no EmptyLatentImage width max: {probe.reason}")
        else:
            facts.append(f"EmptyLatentImage width max {width_max} in the target's interpreter")
            want = patched_value if applied else static.value
            if want is not None and width_max != want:
                problems.append(f"EmptyLatentImage width max is {width_max} in the target's interpreter, expected "
                                f"{want}")
        if probe.outcome is Outcome.FAIL and not problems:
            problems.append(f"importing the target's ComfyUI failed: {probe.reason}")

    if problems:
        return CheckResult(name, Outcome.FAIL, "; ".join(problems), numbers, stderr, duration)
    if applied:
        return CheckResult(name, Outcome.PASS, f"patched: {'; '.join(facts)}", numbers, stderr, duration)
    # Nothing to prove: reading the stock value is no evidence of a raised limit, so this is never a PASS.
    return CheckResult(name, Outcome.WARN, f"{_not_applied(patch, patched_value, static.value)}: {'; '.join(facts)}",
                       numbers, stderr, duration)


def _not_applied(patch, patched_value: int | None, found: int | None) -> str:
    """Why max-resolution is a warning on a tree where the patch is not applied, in words."""
    if patch is None:
        return "not patched: the catalog has no max-resolution patch"
    sets = f" (it sets {patched_value})" if patched_value is not None else ""
    said = f"not patched: the patch {patch.id} is not applied{sets}"
    if found is not None and found == patched_value:
        said += ", although nodes.py holds its value (edited by hand, or applied without a record)"
    return said


@check("resolution-caps", "hard-coded resolution caps in comfy_extras/ and custom_nodes/ below the patched "
       "MAX_RESOLUTION (a warning, never a failure)")
def resolution_caps(ctx) -> CheckResult:
    name = "resolution-caps"
    root = ctx.target.comfyui_root
    if root is None:
        return CheckResult(name, Outcome.SKIP, "the target has no ComfyUI")
    patch, cap = ctx.max_resolution_patch()
    source = f"the value {patch.id} sets" if patch is not None else None
    if cap is None:
        try:
            cap = read_max_resolution(Path(root) / "nodes.py").value
        except (OSError, ApplierError):
            cap = None
        source = "nodes.py's MAX_RESOLUTION"
    if cap is None:
        return CheckResult(name, Outcome.SKIP, "no cap to compare with: no max-resolution patch in the catalog and "
                                               "no MAX_RESOLUTION in nodes.py")
    scan = scan_resolution_caps(Path(root), cap)
    numbers = {"cap": cap, "caps": [str(c) for c in scan.caps], "inputs": [c.what for c in scan.caps],
               "files_scanned": scan.files_scanned, "files_read_by_regex": scan.files_parsed_by_regex,
               "skipped": [f"{path}: {why}" for path, why in scan.skipped], "limits": scan.limits}
    left_out = [_skipped_words(scan.skipped)] if scan.skipped else []
    if scan.limits:      # a bound reached: what lies past it was not looked at, so never a PASS
        left_out.append(f"scan bounded: {'; '.join(scan.limits)}")
    skipped = "; ".join(left_out)
    if not scan.caps:
        if skipped:
            return CheckResult(name, Outcome.WARN, f"no hard-coded cap below {cap} ({source}) in "
                                                   f"{scan.files_scanned} files; {skipped}", numbers)
        return CheckResult(name, Outcome.PASS, f"no hard-coded cap below {cap} ({source}) in "
                                               f"{scan.files_scanned} files", numbers)
    shown = ", ".join(str(c) for c in scan.caps[:5]) + (f" and {len(scan.caps) - 5} more" if len(scan.caps) > 5
                                                         else "")
    applied = patch is not None and patch.id in ctx.applied
    note = "" if applied or patch is None else "; the patch is not applied, and these caps would remain after it"
    count = f"{len(scan.caps)} hard-coded cap{'s' if len(scan.caps) != 1 else ''}"
    return CheckResult(name, Outcome.WARN, f"{count} below {cap} ({source}{note}): {shown}"
                                           + (f"; {skipped}" if skipped else ""), numbers)


def _skipped_words(skipped: list[tuple[str, str]]) -> str:
    """"skipped 2 files: custom_nodes/a.py (a FIFO (named pipe)), ..." or "" when none was."""
    if not skipped:
        return ""
    shown = ", ".join(f"{path} ({why})" for path, why in skipped[:MAX_SKIPPED_LISTED])
    more = f" and {len(skipped) - MAX_SKIPPED_LISTED} more" if len(skipped) > MAX_SKIPPED_LISTED else ""
    return f"skipped {len(skipped)} file{'s' if len(skipped) != 1 else ''} (not read): {shown}{more}"
