"""A worker of test_rel_concurrency.py, in its own process: runs applier commands in a loop through Click's runner
and writes every exit code (with the output of any run that did not end in exit 0, or whose JSON is not coherent)
to a JSON file.

    python tests/reliability/cli_loop.py '{"commands": [[...], ...], "rounds": N, "stop": FILE, "out": FILE}'

It runs `rounds` commands (cycling through `commands`), or until the file `stop` exists when rounds is 0.
"""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from click.testing import CliRunner

from applier.cli import cli


def main(spec: dict) -> None:
    runner = CliRunner()
    results = []
    stop = Path(spec["stop"]) if spec.get("stop") else None
    n = 0
    while (spec.get("rounds") and n < spec["rounds"]) or (not spec.get("rounds") and not stop.exists()):
        argv = spec["commands"][n % len(spec["commands"])]
        result = runner.invoke(cli, argv, env={"APPLIER_NO_GPU_PROBE": "1", "APPLIER_FAILPOINT": None,
                                               "APPLIER_LOCK_TIMEOUT": "300"}, prog_name="applier")
        text = result.stdout + result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            text += "".join(traceback.format_exception(*result.exc_info))
        entry = {"command": argv[0], "code": result.exit_code}
        if "--json" in argv and result.exit_code == 0 and argv[0] == "status":
            try:
                entry["states"] = sorted({p["state"] for p in json.loads(result.stdout)["patches"]})
            except (ValueError, KeyError, TypeError):
                entry["states"] = ["unreadable JSON"]
        if result.exit_code != 0 or "Traceback" in text or len(entry.get("states", [])) > 1:
            entry["output"] = text[-3000:]
        results.append(entry)
        n += 1
    Path(spec["out"]).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
