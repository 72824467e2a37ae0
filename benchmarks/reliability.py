"""Run the reliability suite (tests/reliability, issue 16) and write what it tried and what passed, per section, to
benchmarks/results/reliability-<date>.json (date: today, UTC).

    .venv/bin/python -m benchmarks reliability [--kills N] [--fuzz-examples N] [--rounds N]
                                               [--baseline COMMIT] [--out FILE]

Each section is one test file; a test is "tried" when it ran (not skipped) and "passed" when it passed. Beside the
test counts, the sections that count inside a test report their own figures (tests/reliability/reltools.py
record_figure): the SIGKILL loop its runs, kills and kills that landed mid-write per command, the concurrency test
its writes, reads and false drift reports, the fuzzer its examples and their exit codes per target.

--baseline COMMIT also runs the same tests against the product of an older commit (its files from `git archive`,
these tests copied in, in .cache/): how many of the cases that product fails. Paths of this machine are written
as DIR / REPO.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTIONS = {
    "test_rel_failpoints": "failpoint-matrix",
    "test_rel_sigkill": "sigkill-loop",
    "test_rel_concurrency": "concurrency",
    "test_rel_confinement": "confinement",
    "test_rel_bad_inputs": "bad-inputs",
    "test_rel_fuzz": "fuzz",
    "test_rel_links": "links-and-special-files",
    "test_rel_probes": "interpreters-and-probes",
    "test_rel_races": "races",
    "test_rel_rights": "rights-and-bounds",
    "test_rel_round3_inputs": "inputs-round3",
    "test_rel_round4_disk": "round4-full-disk",
    "test_rel_round4_export": "round4-export",
    "test_rel_round4_rights": "round4-denied-state-files",
    "test_rel_round4_signals": "round4-signals",
    "test_rel_round4_options": "round4-options",
    "test_rel_round4_home": "round4-package-home",
    "test_rel_round4_lock": "round4-lock-holder",
}
# record_figure's section names -> the section whose "figures" they become (cases tried and held inside a test)
FIGURES = {"sigkill": "sigkill-loop", "concurrency": "concurrency", "fuzz": "fuzz",
           "round4-disk": "round4-full-disk", "round4-export": "round4-export",
           "round4-rights": "round4-denied-state-files", "round4-signals": "round4-signals",
           "round4-options": "round4-options", "round4-home": "round4-package-home", "round4-lock": "round4-lock-holder"}


def scrub(text: str, *roots: Path) -> str:
    for root in roots:
        text = text.replace(str(root), "DIR")
    text = text.replace(str(REPO), "REPO")
    return re.sub(r"(?<![\w.])/(tmp|work|root|home|var)/[^\s'\"\]\),]*", "DIR", text)


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def run_suite(product: Path, settings: dict, workdir: Path) -> dict:
    """pytest on product/tests/reliability; per-section counts from its JUnit XML plus the recorded figures."""
    junit, figures, basetemp = workdir / "junit.xml", workdir / "figures.jsonl", workdir / "pytest"
    env = {**os.environ, "APPLIER_RELIABILITY_FIGURES": str(figures), "APPLIER_KILLS": str(settings["kills"]),
           "APPLIER_FUZZ_EXAMPLES": str(settings["fuzz_examples"]),
           "APPLIER_CONCURRENCY_ROUNDS": str(settings["concurrency_rounds"]),
           "APPLIER_RACE_RUNS": str(settings["race_runs"])}
    env.pop("APPLIER_FAILPOINT", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/reliability",
                           f"--junitxml={junit}", f"--basetemp={basetemp}"], cwd=product, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    if not junit.exists():
        raise SystemExit(f"pytest wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    sections = {name: {"tried": 0, "passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": []}
                for name in SECTIONS.values()}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        section = sections.get(SECTIONS.get(module, ""), None)
        if section is None:
            continue
        name = case.get("name")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if skipped is not None:
            section["skipped"] += 1
            section["skips"].append(f"{name}: {scrub(skipped.get('message', ''), basetemp, product)}")
            continue
        section["tried"] += 1
        if failure is None:
            section["passed"] += 1
        else:
            section["failed"] += 1
            message = (failure.get("message") or failure.text or "").strip().splitlines()
            section["failures"].append(f"{name}: {scrub(message[0] if message else '', basetemp, product)[:300]}")
    extra: dict[str, list] = {}
    if figures.exists():
        for line in figures.read_text().splitlines():
            entry = json.loads(line)
            extra.setdefault(entry.pop("section"), []).append(entry)
    for key, name in FIGURES.items():
        if key in extra:
            sections[name]["figures"] = extra[key]
    tried = sum(s["tried"] for s in sections.values())
    passed = sum(s["passed"] for s in sections.values())
    return {"pytest_exit": proc.returncode, "wall_s": round(wall, 1), "tried": tried, "passed": passed,
            "sections": sections}


def add_arguments(parser) -> None:
    parser.add_argument("--kills", type=int, default=int(os.environ.get("APPLIER_KILLS", 50)),
                        help="SIGKILLs per command (default 50, the CI setting)")
    parser.add_argument("--fuzz-examples", type=int, default=int(os.environ.get("APPLIER_FUZZ_EXAMPLES", 100)),
                        help="fuzz examples per target (default 100, the CI setting)")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("APPLIER_CONCURRENCY_ROUNDS", 10)),
                        help="runs per concurrent writer (default 10)")
    parser.add_argument("--race-runs", type=int, default=int(os.environ.get("APPLIER_RACE_RUNS", 3)),
                        help="runs per command of the race section (default 3, the CI setting)")
    parser.add_argument("--baseline", metavar="COMMIT", help="also run the tests against this commit's product")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/reliability-<date>.json")


def run(args, parser=None) -> int:
    settings = {"kills": args.kills, "fuzz_examples": args.fuzz_examples, "concurrency_rounds": args.rounds,
                "race_runs": args.race_runs}
    date = time.strftime("%Y-%m-%d", time.gmtime())
    out = args.out or REPO / "benchmarks" / "results" / f"reliability-{date}.json"
    scratch = REPO / ".cache"
    scratch.mkdir(exist_ok=True)
    report = {
        "kind": "reliability",
        "date": date,
        "command": "python -m benchmarks reliability " + " ".join(
            f"--{k.replace('_', '-').replace('concurrency-rounds', 'rounds')} {v}" for k, v in settings.items())
            + (f" --baseline {args.baseline}" if args.baseline else ""),
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "system": platform.system(), "user_is_root": os.geteuid() == 0},
        "settings": settings,
        "what_counts": "tried = tests that ran (not skipped), passed = tests that passed; per-section 'figures' "
                       "count inside tests (kills, writes and reads, fuzz examples)",
    }
    with tempfile.TemporaryDirectory(dir=scratch, prefix="reliability-") as tmp:
        tmp = Path(tmp)
        (tmp / "now").mkdir()
        dirty = bool(git("status", "--porcelain", "--", "applier"))
        report["product"] = {"commit": git("rev-parse", "HEAD"), "applier_uncommitted_changes": dirty,
                             **run_suite(REPO, settings, tmp / "now")}
        if args.baseline:
            copy = tmp / "baseline-tree"
            copy.mkdir()
            archive = subprocess.run(["git", "archive", args.baseline], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(copy)], input=archive.stdout, check=True)
            shutil.rmtree(copy / "tests" / "reliability", ignore_errors=True)
            shutil.copytree(REPO / "tests" / "reliability", copy / "tests" / "reliability",
                            ignore=shutil.ignore_patterns("__pycache__"))
            (tmp / "baseline").mkdir()
            report["baseline"] = {"commit": git("rev-parse", args.baseline),
                                  "note": "the same tests run against this older commit's product",
                                  **run_suite(copy, settings, tmp / "baseline")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for label in ("product", "baseline"):
        if label in report:
            r = report[label]
            print(f"{label} {r['commit'][:10]}: {r['passed']}/{r['tried']} passed in {r['wall_s']} s")
            for name, s in r["sections"].items():
                print(f"    {name:18} {s['passed']:4}/{s['tried']:<4} passed" + (f", {s['skipped']} skipped"
                                                                               if s["skipped"] else ""))
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0

