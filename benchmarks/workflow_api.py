"""A workflow as ComfyUI's front end saves it (nodes with widgets_values, links) turned into the API prompt that
`POST /prompt` takes, with the server's own `/object_info` naming each widget, as the front end does when it queues.

Widget values follow the node's inputs in the order object_info lists them (required, then optional), skipping
inputs that arrive through a link or take a link type (MODEL, LATENT, ...); an INT input marked
`control_after_generate` (KSampler's seed) is followed by one more saved value, the control mode ("fixed",
"randomize"), which the API prompt does not take. Notes (nodes with no entry in object_info and no outputs) drop out.
"""
from __future__ import annotations

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
SEED_NAMES = {"seed", "noise_seed"}


class WorkflowError(ValueError):
    """A workflow the server's object_info cannot turn into a prompt (a node it lacks, a widget count off)."""


def _is_widget(spec) -> bool:
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    return isinstance(kind, list) or kind in WIDGET_TYPES


def _controls_after(name: str, spec) -> bool:
    options = spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict) else {}
    return bool(options.get("control_after_generate")) or (name in SEED_NAMES and spec[0] == "INT")


def to_prompt(workflow: dict, object_info: dict) -> dict:
    """The API prompt of a saved workflow: {node id: {"class_type", "inputs"}}."""
    sources = {link[0]: (str(link[1]), link[2]) for link in workflow.get("links", [])}
    prompt = {}
    for node in workflow["nodes"]:
        kind = node["type"]
        if kind not in object_info:
            if not node.get("outputs"):
                continue                                   # a Note, a MarkdownNote: nothing to run
            raise WorkflowError(f"node {node['id']}: the server has no {kind} node")
        specs = object_info[kind]["input"]
        ordered = list(specs.get("required", {}).items()) + list(specs.get("optional", {}).items())
        linked = {i["name"]: sources[i["link"]] for i in node.get("inputs", []) if i.get("link") is not None}
        values = list(node.get("widgets_values") or [])
        inputs: dict = {}
        for name, spec in ordered:
            if name in linked:
                inputs[name] = list(linked[name])
                continue
            if not _is_widget(spec):
                continue
            if not values:
                break                                       # an optional widget the saved node does not have
            inputs[name] = values.pop(0)
            if _controls_after(name, spec) and values and isinstance(values[0], str):
                values.pop(0)
        if values:
            raise WorkflowError(f"node {node['id']} ({kind}): {len(values)} saved value(s) left over: {values}")
        prompt[str(node["id"])] = {"class_type": kind, "inputs": inputs}
    return prompt
