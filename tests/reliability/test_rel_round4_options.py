"""Reliability round 4 (issue 49): every numeric option has a range that covers real use and refuses the rest with a
usage error (exit 2) that states the range, before any work (the target named does not even exist: a value that
passes ends in 9, one that does not in 2); with --json a usage error is the JSON error README promises.

The options are found by walking the Click tree (numeric types, and the text options that carry numbers), so a new
numeric option without its edges here fails the first test. `applier budget`'s options are checked by its own tests
(tests/test_budget.py)."""
from __future__ import annotations

import json

import click
import pytest

from reltools import cli, record_figure

pytestmark = pytest.mark.slow

NOWHERE = "/nonexistent/applier-target"
# (command path, option) -> (values inside the range, values outside it, the two bounds the message must name)
EDGES = {
    ("apply", "--fuzz"): (["0", "3"], ["-1", "4", "1000000", "nan", "1.5"], ("0", "3")),
    ("verify", "--timeout"): (["1", "86400", "180.5"], ["0", "0.99", "86401", "-1", "nan", "inf", "-inf", "1e308"],
                              ("1", "86400")),
    ("verify", "--size"): (["16x16", "65536x65536", "1024"], ["15x16", "16x65537", "0x0", "10000000x10000000",
                                                              "-5x5"], ("16", "65536")),
}
TEXT_NUMBERS = {"--size"}     # text options that carry numbers (WxH)
SKIP_COMMANDS = {"budget"}    # its options are the budget's own tests'


def numeric_options() -> set[tuple[str, str]]:
    from applier.cli import cli as group
    found = set()

    def walk(command, path):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
            return
        if path[0] in SKIP_COMMANDS:
            return
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            name = max(param.opts, key=len)
            kind = param.type
            if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)) or name in TEXT_NUMBERS:
                found.add((" ".join(path), name))

    walk(group, ())
    return found


def test_every_numeric_option_has_its_edges_here():
    assert numeric_options() == set(EDGES)


@pytest.mark.parametrize("command, option", sorted(EDGES))
def test_each_numeric_option_refuses_what_is_out_of_range_before_any_work(command, option):
    good, bad, bounds = EDGES[(command, option)]
    tried = held = 0
    problems = []
    for value in good:
        out = cli(*command.split(), option, value, "--target", NOWHERE)
        tried += 1
        if out.code == 9 and "does not exist" in out.text:
            held += 1
        else:
            problems.append(f"{option} {value} (inside the range) -> {out}")
    for value in bad:
        out = cli(*command.split(), option, value, "--target", NOWHERE)
        tried += 1
        if out.code == 2 and all(b in out.stderr for b in bounds) and "Traceback" not in out.text:
            held += 1
        else:
            problems.append(f"{option} {value} (outside) -> exit {out.code}, must be 2 naming {bounds}:\n{out}")
    record_figure("round4-options", option=f"{command} {option}", tried=tried, held=held)
    assert not problems, "\n".join(problems)


USAGE_ERRORS = [
    ("apply", "--fuzz", "9", "--target", NOWHERE),
    ("verify", "--timeout", "nan", "--target", NOWHERE),
    ("verify", "--device", "tpu", "--target", NOWHERE),
    ("status", "--no-such-option", "--target", NOWHERE),
    ("status",),                                            # --target missing
    ("overlay", "export"),                                  # FOLDER missing
    ("overlay", "export", "out", "--publisher", "Not An Id"),
    ("revert", "--target"),                                 # --target without its value
    ("no-such-command",),
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=lambda argv: " ".join(argv[:2]))
def test_a_usage_error_with_json_is_the_json_error(argv):
    out = cli(*argv, "--json") if argv[-1] != "--target" else cli(*argv[:-1], "--json", "--target")
    assert out.code == 2, out
    if argv[-1] == "--target":      # `--target --json`: --json is the target's name there, not a flag
        return
    data = json.loads(out.stdout)
    assert data["ok"] is False and data["error"]["kind"] == "UsageError" and data["error"]["exit_code"] == 2, data
    assert data["error"]["message"] and "Traceback" not in out.text
    plain = cli(*argv)
    assert plain.code == 2 and "Error:" in plain.stderr and not plain.stdout.lstrip().startswith("{")


def test_an_environment_value_refused_before_the_command_with_json_is_the_json_error():
    out = cli("status", "--target", NOWHERE, "--json", env={"APPLIER_LOCK_TIMEOUT": "soon"})
    assert out.code == 2, out
    data = json.loads(out.stdout)
    assert data["error"]["exit_code"] == 2 and "APPLIER_LOCK_TIMEOUT" in data["error"]["message"], data
