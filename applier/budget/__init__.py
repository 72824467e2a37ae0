"""`applier budget`: what a canvas costs on a GPU (tokens, FLOPs, memory, seconds per step) and a verdict.

This package hands names on; the code lives in its modules, one job each (docs/budget.md describes the model):

    records.py   the tables' rows, the target's caps as read, the request; the constants they share
    inputs.py    what the user typed: sizes, durations, model and GPU names, the release's range; their ranges
    cost.py      the cost model: tokens, FLOPs, bytes, seconds per forward per config, the tiled routes
    verdict.py   the verdict's rules: caps, native / tiled / out of reach and why, what reaches it
    plan.py      the budget of one request (Budget), built in one step, and its JSON
    report.py    the budget as text
    data.py      reads the tables (applier/data/*.toml); caps.py reads the target's caps; template.py reads the
                 steps of the pack's tiled template

The budget layer sits beside the overlay pack's installer: it imports only the store's bounded reads, the catalog's
pack metadata and the small shared modules.
"""
from __future__ import annotations

from applier.budget.cost import (Priced, TiledRoute, Tokens, Work, attention_seconds, forward_work, price,
                                 tiled_routes, token_counts)
from applier.budget.inputs import (CFG_RANGE, CPU_CORES_RANGE, FRAMES_RANGE, SIZE_RANGE, STEPS_RANGE, WITHIN_RANGE_S,
                                   choose_gpu, era_for, find_gpu, find_model, parse_duration, parse_size)
from applier.budget.plan import Budget, plan_budget
from applier.budget.records import (CONFIGS, DEFAULT_WITHIN_S, GIB, BudgetData, Canvas, Cap, Efficiency, Gpu, Model,
                                    Request, TargetCaps, UnknownGpuError, UnknownModelError)
from applier.budget.report import report_lines
from applier.budget.verdict import Verdict, VerdictKind, human_bytes, human_seconds

__all__ = [
    "CFG_RANGE", "CONFIGS", "CPU_CORES_RANGE", "DEFAULT_WITHIN_S", "FRAMES_RANGE", "GIB", "SIZE_RANGE", "STEPS_RANGE",
    "WITHIN_RANGE_S",
    "Budget", "BudgetData", "Canvas", "Cap", "Efficiency", "Gpu", "Model", "Priced", "Request", "TargetCaps",
    "TiledRoute", "Tokens", "UnknownGpuError", "UnknownModelError", "Verdict", "VerdictKind", "Work",
    "attention_seconds", "choose_gpu", "era_for", "find_gpu", "find_model", "forward_work", "human_bytes",
    "human_seconds", "parse_duration", "parse_size", "plan_budget", "price", "report_lines", "tiled_routes",
    "token_counts",
]
