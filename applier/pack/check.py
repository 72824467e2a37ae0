"""`applier overlay check`: which overlay variant each model family and op family of a ComfyUI tree would run.

Static and torch-free: the target's ComfyUI files are read (fsutil.read_inside_or_none: bounded, regular files
only, none that a link leads out of the tree) and parsed with `ast`, never imported. The code each variant depends
on is found the way Python would bind it - a name in a module, followed through `from X import name` into the file
that defines it - and fingerprinted with the overlay pack's own normaliser (`overlays/fused_dit/fingerprint.py`,
loaded by path), then compared with the releases the pack records in `fused_dit/variants.json`
(`fused_dit/variants.py`, loaded the same way). The node makes the same comparison at run time on the live objects,
so both say the same thing about the same code.

Per model family present in the tree (Flux.1, Flux.2, Chroma, HunyuanVideo, Wan 2.1/2.2, Qwen-Image, Lumina 2 /
Z-Image, HunyuanImage 2.1, SD3.5, HiDream-I1, Kandinsky 5) and per op family (norm_rope, adaln, gate, fp8_linear, attention): whether it runs (the variant and the
release it was verified on; for attention, the release's SDPA order read from comfy/ops.py), in the user's words
("label" and "says": the model, the ComfyUI release, the kernel; what `overlay check` prints), with the internal
ids kept for --json and --verbose ("variant", "short", and the long "reason" with the differing code). FP8 reaches
a model the block families do not know through ComfyUI's Linear ops in its stack of blocks, as the node does
(fused_dit.integration.generic_blocks). The report also names where the node is installed, by applier or the
ComfyUI way (ComfyUI-Manager, `comfy node install`), and says when that copy is another version than the one
judged here.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from applier.errors import BadTargetError, RefusedError
from applier.resources import OVERLAYS_DIR, PACK_PACKAGE, load_pack_module
from applier.store.fsutil import read_inside_or_none

BLOCKS = "{blocks}"
FAMILIES = ("norm_rope", "adaln", "gate", "fp8_linear")       # the families a variant of ComfyUI code serves
ATTENTION = "attention"                 # the family that needs no code of ComfyUI's, only its SDPA order
SDPA_ORDER_FILE, SDPA_ORDER_NAME = "comfy/ops.py", "SDPA_BACKEND_PRIORITY"
MAX_IMPORT_HOPS = 8


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_file: str                       # the file whose presence says the tree has the model
    block_class: str | None               # a block class its model builds (None: no overlay variant for it)
    variant: str | None                   # the block-forward variant that would serve it
    marker: str | None = None             # a class comfy/supported_models.py must define (for shared model files)
    no_variant: str = ""                  # why there is none
    title: str = ""                       # the name users know it by, where it is not `name`
    no_variant_says: str = ""             # why there is none, in the user's words (default: NO_BLOCKS_SAYS)

    @property
    def shown(self) -> str:
        return self.title or self.name


_NO_BLOCKS = "the overlay has no variant for this model's blocks: all families stay stock"
MODEL_FAMILIES = (
    ModelFamily("Flux", "comfy/ldm/flux/model.py", "DoubleStreamBlock", "flux_block_forward_0.3", "Flux",
                title="Flux.1"),
    ModelFamily("Flux.2", "comfy/ldm/flux/model.py", "DoubleStreamBlock", "flux_block_forward_0.3", "Flux2"),
    ModelFamily("Chroma", "comfy/ldm/chroma/model.py", "DoubleStreamBlock", "flux_block_forward_0.3", "Chroma"),
    ModelFamily("HunyuanVideo", "comfy/ldm/hunyuan_video/model.py", "DoubleStreamBlock", "flux_block_forward_0.3",
                "HunyuanVideo"),
    ModelFamily("Wan 2.1", "comfy/ldm/wan/model.py", "WanAttentionBlock", "wan_block_forward_0.3"),
    ModelFamily("Wan 2.2", "comfy/ldm/wan/model.py", "WanAttentionBlock", "wan_block_forward_0.3", "WAN22_T2V"),
    ModelFamily("Qwen-Image", "comfy/ldm/qwen_image/model.py", None, None, "QwenImage", _NO_BLOCKS),
    ModelFamily("Lumina 2", "comfy/ldm/lumina/model.py", None, None, "Lumina2", _NO_BLOCKS),
    ModelFamily("Z-Image", "comfy/ldm/lumina/model.py", None, None, "ZImage", _NO_BLOCKS),
    ModelFamily("HunyuanImage 2.1", "comfy/ldm/hunyuan_video/model.py", "DoubleStreamBlock", "flux_block_forward_0.3",
                "HunyuanImage21"),
    ModelFamily("SD3", "comfy/ldm/modules/diffusionmodules/mmdit.py", None, None, "SD3", _NO_BLOCKS,
                title="SD3.5", no_variant_says="its MMDiT joint blocks are neither Flux's nor Wan's"),
    ModelFamily("HiDream", "comfy/ldm/hidream/model.py", None, None, "HiDream", _NO_BLOCKS, title="HiDream-I1",
                no_variant_says="its mixture-of-experts blocks are neither Flux's nor Wan's"),
    ModelFamily("Kandinsky 5", "comfy/ldm/kandinsky5/model.py", None, None, "Kandinsky5", _NO_BLOCKS,
                no_variant_says="its blocks are neither Flux's nor Wan's"),
    ModelFamily("Qwen-Image 2.1", "comfy/ldm/qwen_image21/model.py", None, None, None,
                "its blocks call comfy-kitchen's rms_rope and adaln directly and add the gate inline: the block "
                "families have no seam there and stay stock (fp8_linear and attention reach it through ComfyUI's "
                "Linear and attention seams, checked on the assembled 0.38.1 tree)",
                no_variant_says="its blocks call comfy-kitchen's kernels directly, with nothing the pack can swap"),
)

# --------------------------------------------------------------- the user's words (what `overlay check` prints)
BLOCKS_OF = {"DoubleStreamBlock": "Flux", "WanAttentionBlock": "Wan"}     # whose blocks a block forward copies
RUNS, STOCK = "runs", "stays ComfyUI's own"
NO_BLOCKS_SAYS = "the pack's fused blocks are Flux's and Wan's only"
# FP8 on a model the block families do not know, where it was timed (the node's line, registry._on_unknown_model)
GENERIC_FP8_SAYS = {"Qwen-Image": "faster from 2048 px, slower at 1024 px",
                    "Z-Image": "faster from 2048 px (1024 untimed)"}
GENERIC_FP8_UNTIMED = "timed on Qwen-Image and Z-Image only"   # on another model's line
LABEL_WIDTH = 28
LEGEND = ("What the node Fused DiT Ops runs with each toggle on (FP8 Linears is off by default), or why a part "
          "stays ComfyUI's own:")


class SourceTree:
    """A ComfyUI tree's Python files, read and parsed once each, and names resolved through their imports."""

    def __init__(self, root: Path, fingerprint: ModuleType):
        self.root = root
        self.fingerprint = fingerprint
        self._parsed: dict[str, tuple[str, ast.Module] | None] = {}

    def parsed(self, relpath: str) -> tuple[str, ast.Module] | None:
        if relpath not in self._parsed:
            data = read_inside_or_none(self.root, self.root / relpath)
            if data is None:
                self._parsed[relpath] = None
            else:
                text = data.decode("utf-8", errors="replace")
                try:
                    self._parsed[relpath] = (text, ast.parse(text))
                except SyntaxError:
                    self._parsed[relpath] = None
        return self._parsed[relpath]

    def exists(self, relpath: str) -> bool:
        return self.parsed(relpath) is not None

    def module_file(self, from_file: str, module: str | None, level: int) -> str | None:
        """The file an import names, relative to the root (a package's __init__.py), or None outside the tree."""
        if level:
            base = Path(from_file).parent
            for _ in range(level - 1):
                if base == Path("."):
                    return None
                base = base.parent
            parts = [*base.parts, *(module.split(".") if module else [])]
        else:
            parts = module.split(".") if module else []
        if not parts or any(p in ("", "..", ".") for p in parts):
            return None
        for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
            if self.exists(candidate):
                return candidate
        return None

    def definition(self, relpath: str, qualname: str, hops: int = 0) -> tuple[str, ast.AST]:
        """(file, def/class node) that `qualname` names in `relpath`, following `from X import name`."""
        parsed = self.parsed(relpath)
        if parsed is None:
            raise self.fingerprint.Unresolved(f"{relpath} is missing or does not parse")
        first, _, rest = qualname.partition(".")
        bindings = list(self.fingerprint.bindings_of(parsed[1], first))
        if len(bindings) == 1 and isinstance(bindings[0], ast.ImportFrom) and hops < MAX_IMPORT_HOPS:
            node = bindings[0]
            alias = next(a for a in node.names if (a.asname or a.name) == first)
            target = self.module_file(relpath, node.module, node.level)
            if target is None:
                raise self.fingerprint.Unresolved(f"{first} is imported from {node.module}, outside the tree")
            return self.definition(target, alias.name + ("." + rest if rest else ""), hops + 1)
        return relpath, self.fingerprint.find_definition(parsed[0], qualname)

    def block_file(self, model_file: str, class_name: str) -> str | None:
        """The file that defines the block class a model file builds (imported by name, used as
        `comfy.x.y.Class`, or defined in the model file itself)."""
        try:
            return self.definition(model_file, class_name)[0]
        except self.fingerprint.Unresolved:
            pass
        parsed = self.parsed(model_file)
        for node in ast.walk(parsed[1]) if parsed else ():
            if isinstance(node, ast.Attribute) and node.attr == class_name:
                target = self.module_file(model_file, ast.unparse(node.value), 0)
                if target is not None:
                    try:
                        return self.definition(target, class_name)[0]
                    except self.fingerprint.Unresolved:
                        continue
        return None

    def fingerprints(self, depends_on, blocks_file: str | None) -> tuple[dict, dict]:
        """({dependency key: sha256 or None}, {dependency key: where it was found, or why it has none})."""
        found, where = {}, {}
        for key in depends_on:
            file_part, _, qualname = key.partition(":")
            relpath = blocks_file if file_part == BLOCKS else file_part
            try:
                if relpath is None:
                    raise self.fingerprint.Unresolved("the model's block file was not found")
                defined_in, node = self.definition(relpath, qualname)
                found[key], where[key] = self.fingerprint.of_node(node), f"{defined_in}:{qualname}"
            except self.fingerprint.Unresolved as exc:
                found[key], where[key] = None, str(exc)
        return found, where


def _verdict_json(variants_module, spec, found: dict, where: dict, version: str | None) -> dict:
    """A variant's verdict on this code; one that matches but is off by default (and not switched on in this
    environment) is reported as not running, with why."""
    verdict = variants_module.match(spec, found, where, prefer=version)
    off = spec.switched_off() if verdict.matched else None
    releases = ", ".join(dict.fromkeys(release.split(":")[0] for release in spec.verified_versions)) or "none"
    if off:
        short = f"{spec.name}: off by default ({variants_module.SWITCH_ON} turns it on)"
    elif verdict.matched:
        short = f"{spec.name} (verified on {verdict.verified_on})"
    else:
        short = f"{spec.name}: verified on {releases}, this code differs"
    return {"variant": spec.name, "kind": spec.kind, "families": list(spec.families),
            "verified_on": spec.verified_versions, "code_matches": verdict.verified_on,
            "matched": None if off else verdict.verified_on,
            "reason": f"code matches ComfyUI {verdict.verified_on}, but {off}" if off else verdict.reason,
            "short": short, "code": {key: {"sha256": found[key], "at": where[key]} for key in found}}


def check_tree(comfyui_root: Path, comfyui_version: str | None = None, overlays_dir: Path = OVERLAYS_DIR,
               variants_file: Path | None = None, node_pack: list[dict] | None = None) -> dict:
    """The report of `applier overlay check` for one ComfyUI folder (see the module docstring). node_pack: where the
    pack's node is installed (status.node_pack_installs), carried into the report with what it means for it."""
    fingerprint = load_pack_module("fingerprint", overlays_dir)
    variants_module = load_pack_module("variants", overlays_dir)
    families_module = load_pack_module("families", overlays_dir)
    data_file = variants_file or overlays_dir / PACK_PACKAGE / "variants.json"
    try:
        specs = variants_module.load(data_file)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RefusedError(f"the overlay pack's {data_file} is unreadable ({type(exc).__name__}: {exc})",
                           hint="reinstall applier") from exc
    tree = SourceTree(Path(comfyui_root), fingerprint)
    if not tree.exists("comfy/model_base.py") and not tree.exists("comfy/ops.py"):
        raise BadTargetError(f"{comfyui_root} holds no ComfyUI code (comfy/model_base.py, comfy/ops.py)",
                             hint="point --target at the ComfyUI folder (the one with main.py and comfy/)")
    seams = {name: _verdict_json(variants_module, spec, *tree.fingerprints(spec.depends_on, None), comfyui_version)
             for name, spec in specs.items() if spec.kind == variants_module.OP_SEAM}
    supported = tree.parsed("comfy/supported_models.py")
    model_classes = {n.name for n in supported[1].body if isinstance(n, ast.ClassDef)} if supported else set()
    attention = attention_verdict(sdpa_order(tree), families_module.ATTENTION_MODE_IMPLEMENTATIONS["exact"])
    models = []
    for family in MODEL_FAMILIES:
        if not tree.exists(family.model_file) or (family.marker and family.marker not in model_classes):
            continue
        entry = {"model": family.name, "shown": family.shown,
                 "heading": f"{family.shown} on ComfyUI {comfyui_version}:" if comfyui_version else f"{family.shown}:",
                 "model_file": family.model_file, "families": {}}
        if family.variant is None:
            entry["families"] = {name: {"variant": None, "matched": None, "reason": family.no_variant,
                                        "short": "no variant for this model's blocks",
                                        "says": f"{STOCK}: {family.no_variant_says or NO_BLOCKS_SAYS}"}
                                 for name in FAMILIES}
            entry["families"]["fp8_linear"] = _generic_fp8(tree, family, seams)
        else:
            spec = specs[family.variant]
            entry["blocks_file"] = tree.block_file(family.model_file, family.block_class)
            block_report = _verdict_json(variants_module, spec,
                                         *tree.fingerprints(spec.depends_on, entry["blocks_file"]), comfyui_version)
            entry["variants"] = {spec.name: block_report}
            for name in FAMILIES:
                entry["families"][name] = _family_verdict(name, block_report, seams, tree, entry["blocks_file"],
                                                          family, comfyui_version)
        for verdict in entry["families"].values():
            verdict["runs"] = verdict["matched"] is not None
        entry["families"][ATTENTION] = dict(attention)
        for name, verdict in entry["families"].items():
            verdict["label"] = families_module.FAMILIES[name].words
        models.append(entry)
    return {"comfyui_root": str(comfyui_root), "comfyui_version": comfyui_version, "legend": LEGEND,
            "models": models, "seams": seams,
            **({} if node_pack is None else {"node_pack": node_pack, "node_pack_note": node_pack_note(node_pack)}),
            "variants": {name: {"kind": s.kind, "families": list(s.families), "verified_on": s.verified_versions,
                                "about": s.about} for name, s in specs.items()}}


def node_pack_note(installs: list[dict]) -> str | None:
    """Why the report may not say what the installed node does: it judges with this applier's variants.json, and a
    node installed the ComfyUI way from another version judges with its own."""
    others = [i for i in installs if not i["disabled"] and not i["same_as_this_applier"]]
    if not installs:
        return "the node pack is not installed: this is what it would run"
    if others:
        return (f"{', '.join(i['folder'] for i in others)} holds another version of the node pack "
                f"({', '.join(str(i['version']) for i in others)}): this report is this applier's pack's verdict; "
                "that node judges with its own fused_dit/variants.json")
    return None


def sdpa_order(tree: SourceTree) -> list[str] | None:
    """The SDPA backends in the order comfy/ops.py gives them on CUDA (its SDPA_BACKEND_PRIORITY list, then the
    insert / append / remove calls on it in source order; conditions around them are not evaluated), or None where
    the file has no such list (a release before it)."""
    parsed = tree.parsed(SDPA_ORDER_FILE)
    order = None
    statements = [node for node in ast.walk(parsed[1]) if isinstance(node, (ast.Assign, ast.Expr))] if parsed else []
    for node in sorted(statements, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and any(
                isinstance(t, ast.Name) and t.id == SDPA_ORDER_NAME for t in node.targets):
            order = [_backend_name(e) for e in node.value.elts]
            continue
        call = node.value if isinstance(node, ast.Expr) else None
        if order is None or not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) \
                or not isinstance(call.func.value, ast.Name) or call.func.value.id != SDPA_ORDER_NAME:
            continue
        args = call.args
        if call.func.attr == "insert" and len(args) == 2 and isinstance(args[0], ast.Constant) \
                and isinstance(args[0].value, int):
            order.insert(args[0].value, _backend_name(args[1]))
        elif call.func.attr == "append" and len(args) == 1:
            order.append(_backend_name(args[0]))
        elif call.func.attr == "remove" and len(args) == 1 and _backend_name(args[0]) in order:
            order.remove(_backend_name(args[0]))
    return order


def _backend_name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ast.unparse(node)     # SDPBackend.FLASH_ATTENTION


def attention_verdict(order: list[str] | None, implementation) -> dict:
    """The attention family on a tree whose SDPA order is `order`: its override runs where the order's first backend
    leaves it a gain (families.Needs.gains_after), as the registry decides at run time."""
    name, gains_after = implementation.name, implementation.needs.gains_after
    if not order:
        return {"variant": name, "matched": None, "runs": False, "short": "no SDPA order to change",
                "reason": f"{SDPA_ORDER_FILE} orders no SDPA backends ({SDPA_ORDER_NAME}: a release before it), so "
                          "there is nothing to reorder",
                "says": f"{STOCK}: this release sets no order of SDPA backends to improve on"}
    listed = f"the release's SDPA order on CUDA is {', '.join(order)} ({SDPA_ORDER_FILE})"
    if order[0] in gains_after:
        cited = f"; {implementation.faster.cite()}" if implementation.faster else ""
        return {"variant": name, "matched": None, "runs": True,
                "short": f"{name} ({order[0]} first in the release's SDPA order)",
                "reason": f"{listed}: {name} puts the fastest exact backend first for each shape{cited}",
                "says": f"{RUNS}: the fastest exact SDPA backend for each shape (this release puts {order[0]} first)"}
    cited = f"; {implementation.no_gain.cite()}" if implementation.no_gain else ""
    return {"variant": name, "matched": None, "runs": False,
            "short": f"{order[0]} is first in the release's SDPA order",
            "reason": f"{listed}: with {order[0]} first {name} was measured no faster than that order{cited}",
            "says": f"{STOCK}: this release puts {order[0]} first, where picking per shape was measured no faster"}


ROPE_CALLERS = ("attention", "apply_rope1")     # what Flux-type blocks and Wan's blocks call for RoPE


def _calls_rope_seam(tree: SourceTree, blocks_file: str | None, seam: dict) -> bool:
    """Whether the model's blocks reach RoPE through the module the seam's code lives in."""
    seam_files = {key.partition(":")[0] for key in seam["code"]}
    for name in ROPE_CALLERS:
        try:
            if blocks_file and tree.definition(blocks_file, name)[0] in seam_files:
                return True
        except tree.fingerprint.Unresolved:
            continue
    return False


def _family_verdict(family: str, block_report: dict, seams: dict, tree: SourceTree, blocks_file: str | None,
                    model: ModelFamily, version: str | None) -> dict:
    """The variant one op family runs on one model: its block forward's, else a seam of that family; with what
    runs, or why it stays stock, in the user's words ("says")."""
    blocks = BLOCKS_OF.get(model.block_class or "", model.shown)
    if block_report["matched"] and family in block_report["families"]:
        return _verdict_of(block_report, f"{RUNS}, in the pack's copy of ComfyUI {_release(block_report['matched'])}'s "
                                         f"{blocks} block forward")
    seam = next((seam for seam in seams.values() if family in seam["families"]), None)
    if family == "fp8_linear" and seam is not None:
        return _verdict_of(seam, _fp8_says(seam))
    written = f"{STOCK}: {_written_for(block_report, blocks, model, version)}"
    if seam is not None and _calls_rope_seam(tree, blocks_file, seam):
        if seam["matched"]:
            return _verdict_of(seam, f"{RUNS} for RoPE alone (ComfyUI {_release(seam['matched'])}'s apply_rope code); "
                                     "the QK RMSNorm stays ComfyUI's")
        rope = "off by default (slower)" if seam["code_matches"] else "its code differs too"
        return {"variant": None, "matched": None,
                "reason": f"{block_report['variant']}: {block_report['reason']}; {seam['variant']}: "
                          f"{seam['reason']}", "short": f"{block_report['short']}; {seam['short']}",
                "says": f"{written}; RoPE alone: {rope}"}
    return {"variant": None, "matched": None, "reason": f"{block_report['variant']}: {block_report['reason']}; no op "
            "seam serves this family (ComfyUI computes it inline in the block forward)",
            "short": block_report["short"], "says": written}


def _verdict_of(source: dict, says: str) -> dict:
    return {"variant": source["variant"], "matched": source["matched"], "reason": source["reason"],
            "short": source["short"], "says": says}


def _release(verified_on: str) -> str:
    """The ComfyUI release of a verified_on key ("0.33.0:mixed_precision_ops().Linear" is 0.33.0)."""
    return verified_on.split(":")[0]


def _releases(report: dict) -> str:
    return ", ".join(dict.fromkeys(_release(key) for key in report["verified_on"])) or "no release"


def _written_for(block_report: dict, blocks: str, model: ModelFamily, version: str | None) -> str:
    """Why a block forward does not run, in words: whose blocks of which release it copies, and what differs."""
    if version is not None and version in {_release(key) for key in block_report["verified_on"]}:
        differs = f"{model.shown}'s differ"                 # the release it was written for, another model's blocks
    else:
        differs = "this release's differ" if version else "this tree's differ"
    return f"written for ComfyUI {_releases(block_report)}'s {blocks} blocks, {differs}"


def _fp8_says(seam: dict, where: str = "") -> str:
    if seam["matched"]:
        return f"{RUNS}, through ComfyUI's Linear ops{where} (ComfyUI {_release(seam['matched'])}'s code, verified)"
    if seam["code_matches"]:
        return f"{STOCK}: its code is ComfyUI {_release(seam['code_matches'])}'s, but FP8 is off by default there"
    return f"{STOCK}: ComfyUI's Linear ops here differ from the releases FP8 was verified on ({_releases(seam)})"


def _generic_fp8(tree: SourceTree, model: ModelFamily, seams: dict) -> dict:
    """FP8 on a model whose blocks the block families do not know: the Linear seam in its stack of blocks, where
    its model file builds one (the node takes every nn.ModuleList of blocks of one class: generic_blocks)."""
    seam = next((seam for seam in seams.values() if "fp8_linear" in seam["families"]), None)
    if seam is None or not builds_block_stack(tree, model.model_file):
        return {"variant": None, "matched": None,
                "reason": f"{model.no_variant}; {model.model_file} builds no nn.ModuleList of blocks for fp8_linear",
                "short": "no variant for this model's blocks, and no stack of blocks",
                "says": f"{STOCK}: {model.model_file} builds no stack of blocks for FP8 to reach"}
    says = _fp8_says(seam, " in its blocks")
    measured = GENERIC_FP8_SAYS.get(model.shown, GENERIC_FP8_UNTIMED)
    return _verdict_of(seam, f"{says}; {measured}" if seam["matched"] else says)


def builds_block_stack(tree: SourceTree, model_file: str) -> bool:
    """Whether the model file builds an nn.ModuleList (its transformer blocks, as ComfyUI's DiTs hold them)."""
    parsed = tree.parsed(model_file)
    return parsed is not None and any(
        isinstance(node, ast.Call) and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
        == "ModuleList" for node in ast.walk(parsed[1]))


def report_lines(report: dict, verbose: bool = False) -> list[str]:
    """What `overlay check` prints of a report: the legend, then per model its heading and one line per op family in
    the user's words (no internal id); verbose: under each line, the pack's names for it and the long reason."""
    lines = [report["legend"]]
    for model in report["models"]:
        lines.append(model["heading"])
        for family, verdict in model["families"].items():
            lines.append(f"    {verdict['label']:{LABEL_WIDTH}} {verdict['says']}")
            if verbose:
                lines.append(f"{'':{LABEL_WIDTH + 5}}{family}: {verdict['variant'] or 'stock'}: {verdict['reason']}")
    return lines


def speeds_up(report: dict) -> dict[str, list[str]]:
    """{model: the op families that run (a verified variant; attention: the release's SDPA order)} of a report."""
    return {m["model"]: [f for f, v in m["families"].items() if v["runs"]] for m in report["models"]}
