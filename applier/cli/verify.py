"""applier verify: its options' ranges, the progress line per check on stderr, the results and exit 6."""
from __future__ import annotations

import os
import sys

import click

from applier.cli.group import cli, out_json, target_options
from applier.errors import EXIT_VERIFY_FAILED


def _verify_size(text):
    """--size WxH as (width, height); a usage error (exit 2) otherwise."""
    if text is None:
        return None
    from applier import budget
    try:
        return budget.parse_size(text)
    except ValueError as exc:
        low, high = budget.SIZE_RANGE
        message = str(exc) if f"{low} to {high}" in str(exc) else f"{exc}; each side from {low} to {high} pixels"
        raise click.BadParameter(message, param_hint="--size") from None


TIMEOUT_RANGE_S = (1.0, 24 * 3600.0)    # a check's subprocess: a second to a day (kernel parity takes minutes)


def _verify_timeout(value):
    """--timeout within TIMEOUT_RANGE_S; nan, inf, zero and negatives are a usage error (exit 2) before any work."""
    low, high = TIMEOUT_RANGE_S
    if value is not None and not low <= value <= high:     # False for nan as well
        raise click.BadParameter(f"{value} is not a timeout applier can use: give seconds from {low:g} to "
                                 f"{high:g} (a day)")
    return value


@cli.command()
@target_options
@click.option("--only", multiple=True, metavar="CHECK", help="Only this check. Repeatable.")
@click.option("--kernels/--no-kernels", default=False, show_default=True,
              help="Run kernel parity of installed overlays.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--real-import", is_flag=True, help="Import the target's ComfyUI nodes in its own interpreter.")
@click.option("--timeout", type=float, default=None, callback=lambda _c, _p, v: _verify_timeout(v),
              help=f"Seconds per check subprocess, {TIMEOUT_RANGE_S[0]:g} to {TIMEOUT_RANGE_S[1]:g} "
                   "[default: 180; kernel-parity 900].")
@click.option("--size", metavar="WxH", default=None, callback=lambda _c, _p, v: _verify_size(v),
              help="Also run the reach check: every cap below this canvas (e.g. 32768x18432).")
@click.option("--keep-pythonpath", is_flag=True,
              help="Pass PYTHONPATH on to the checks that run in the target's interpreter (isolated, without it, "
                   "by default).")
def verify(invocation, only, kernels, device, real_import, timeout, size, keep_pythonpath):
    """Prove the effect: MAX_RESOLUTION as the server sees it, each patch's behaviour, kernel parity.

    A line per check on stderr as it starts and ends. The checks that need torch run in the target's interpreter
    isolated (python -I), without PYTHONPATH, as ComfyUI started from its own folder would; --keep-pythonpath
    passes it on. Exit 6 when a check FAILs or every check SKIPs (SKIP is never PASS).
    Example: applier verify --target ComfyUI/
    """
    from applier.catalog.allowlist import store_for
    from applier.resources import load_verify
    from applier.store.journal import recover_if_pending
    verify_pkg = load_verify()
    found = invocation.target()
    catalog = invocation.catalog
    store = store_for(found, catalog)
    recover_if_pending(store)   # an interrupted apply/revert is finished before anything is judged
    state = store.load()
    tty = sys.stderr.isatty()
    shown = tty or not invocation.as_json      # --json's reader gets the document alone, unless at a terminal
    if shown and os.environ.get("PYTHONPATH") and not keep_pythonpath:
        click.echo(f"note: {verify_pkg.KEEP_PYTHONPATH_HINT}", err=True)

    def progress(step):
        """A line per check on stderr: "[3/12] name ..." as it starts, its outcome and time as it ends (on a
        terminal the end overwrites the start)."""
        if not shown:
            return
        head = f"[{step.index}/{step.total}] {step.name}"
        if step.result is None:
            click.echo(f"{head} ...", err=True, nl=not tty)
        else:
            outcome = getattr(step.result.outcome, "value", step.result.outcome)
            click.echo(("\r\033[K" if tty else "") + f"{head}: {outcome} in {step.result.duration_s:.1f} s",
                       err=True)

    limits = {} if timeout is None else {"timeout": timeout, "kernel_timeout": timeout}
    options = verify_pkg.VerifyOptions(target=found, catalog=catalog, state=state, device=device, kernels=kernels,
                                       real_import=real_import, only=tuple(only), progress=progress, size=size,
                                       keep_pythonpath=keep_pythonpath, **limits)
    results = verify_pkg.run_verify(options)
    ok = verify_pkg.overall_ok(results)
    if invocation.as_json:
        out_json(verify_pkg.results_to_json(results, target=found))
    else:
        colors = {"PASS": "green", "FAIL": "red", "WARN": "yellow", "SKIP": "cyan"}
        width = max((len(r.name) for r in results), default=10)
        for r in results:
            outcome = r.outcome.value if hasattr(r.outcome, "value") else str(r.outcome)
            click.echo(f"{r.name.ljust(width)}  " + click.style(f"{outcome:4}", fg=colors.get(outcome))
                       + f"  {r.reason}")
        counts = {}
        for r in results:
            key = r.outcome.value if hasattr(r.outcome, "value") else str(r.outcome)
            counts[key] = counts.get(key, 0) + 1
        click.echo(", ".join(f"{counts.get(k, 0)} {k}" for k in ("PASS", "FAIL", "WARN", "SKIP")))
        if verify_pkg.nothing_verified(results):
            click.echo("nothing was verified: every check SKIPped (the reasons above say what is missing)")
    if not ok:
        sys.exit(EXIT_VERIFY_FAILED)

