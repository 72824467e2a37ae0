"""What the block-forward overlays share: a block class they know (BlockSpec) and how they reach its module.

flux.py and wan.py each declare their blocks as BlockSpecs; the installer (integration/__init__.py) recognises a
block by its class name and forward signature (`forward_matches`) and runs the spec's forward in its place. The
overlay forwards find the helpers the model's own code uses (`attention`, `optimized_attention`, `repeat_e`) in the
module that defines the block class (`defining_module_global`), so they call the same attention backend ComfyUI
selected, and test fixtures can supply their own.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockSpec:
    """A ComfyUI block class the overlays know (flux.BLOCKS, wan.BLOCKS)."""
    class_name: str
    parameters: tuple[str, ...]       # its forward's parameter names, the ones the overlay forward was written for
    forward: Callable                 # forward(block, ops, stock, *args, **kwargs)
    linear_skip: tuple[str, ...]      # submodules whose Linears stay stock under fp8_linear (the modulation)
    variant: str                      # its name in variants.json
    dependencies: Callable            # block -> {dependency key: the live function/class it runs}


def defining_module_global(block: torch.nn.Module, class_name: str, name: str):
    """A global of the module that defines `class_name` (walked up block's MRO), e.g. ComfyUI's `attention`."""
    for cls in type(block).__mro__:
        if cls.__name__ == class_name:
            # the class's forward sees its module's globals even when the module is not in sys.modules. No truth
            # test of the dict: under torch.compile Dynamo would guard on its length, which changes whenever a
            # graph break adds resume functions to the module, and every step would recompile
            namespace = getattr(cls.forward, "__globals__", None)
            if namespace is None:
                namespace = vars(sys.modules[cls.__module__])
            return namespace[name]
    raise LookupError(f"{type(block).__name__} has no base class {class_name}")


def forward_matches(block: torch.nn.Module, class_name: str, expected_parameters: tuple[str, ...]) -> str | None:
    """None when the block's forward is the one the overlay was written for, else the reason it is not."""
    defining = next((c for c in type(block).__mro__ if c.__name__ == class_name), None)
    if defining is None:
        return f"{type(block).__name__} is not a {class_name}"
    if type(block).forward is not defining.forward:
        return f"{type(block).__name__} overrides {class_name}.forward"
    names = tuple(inspect.signature(defining.forward).parameters)[1:]
    if names != expected_parameters:
        return f"{class_name}.forward takes {names}; the overlay was written for {expected_parameters}"
    return None
