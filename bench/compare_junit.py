"""Compare pytest outcomes test by test: every test's outcome (passed, failed, skipped, xfailed) on one side
against the other's, each side one or more pytest junit XML files or `pytest -v` logs.

    python bench/compare_junit.py docs/data/liger_suite-h200-jit_cold.xml -- docs/data/liger_suite-h200-served.xml
    python bench/compare_junit.py jit.xml jit5_outcomes.txt -- served16.xml         # several files on a side
    python bench/compare_junit.py --ran-only jit.xml -- one_process.xml             # a run cut short: its tests only

A test is named by its file's name and its test id, so runs from another folder (or rootdir) compare; where
one side's junit names no file (an empty classname), both sides are compared by test id. Prints
each side's counts and every test whose outcome differs (or that only one side has); exits 1 if any does.
Used to show that a test suite served from kforge bundles ends exactly as it does on Triton's JIT.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET

VERBOSE = re.compile(r"^(\S+\.py)::(\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b")
WORDS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped", "XFAIL": "xfailed",
         "XPASS": "passed"}


def _junit(path: str) -> dict[str, str]:
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("name") is None:   # what a run stopped by Ctrl-C leaves for the test it stopped in
            continue
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "xfailed" if "xfail" in (kinds["skipped"].get("type") or "") else "skipped"
        else:
            outcome = "passed"
        found[f"{(case.get('classname') or '').rsplit('.', 1)[-1]}::{case.get('name')}"] = outcome
    return found


def _verbose(path: str) -> dict[str, str]:
    found = {}
    with open(path) as f:
        for line in f:
            m = VERBOSE.match(line.strip())
            if m:
                found[f"{m[1].rsplit('/', 1)[-1][:-3]}::{m[2]}"] = WORDS[m[3]]
    return found


def outcomes(paths: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        found.update(_junit(path) if path.endswith(".xml") else _verbose(path))
    return found


def by_id(found: dict[str, str]) -> dict[str, str]:
    """The outcomes keyed by test id alone, for a side whose junit names no file (its classname empty: pytest run
    with a rootdir above the tests); an id that two files share keeps both, file-named."""
    ids = collections.Counter(t.split("::", 1)[1] for t in found)
    return {(t.split("::", 1)[1] if ids[t.split("::", 1)[1]] == 1 else t): o for t, o in found.items()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python bench/compare_junit.py")
    ap.add_argument("--ran-only", action="store_true", help="compare only the tests the other side has")
    ap.add_argument("files", nargs="+", help="REFERENCE... -- OTHER...")
    a = ap.parse_args(argv)
    if "--" not in argv:
        ap.error("give the two sides as REFERENCE... -- OTHER...")
    split = argv.index("--")
    sides = [[p for p in argv[:split] if p != "--ran-only"], argv[split + 1:]]
    if not all(sides):
        ap.error("each side needs at least one file")
    ref, other = (outcomes(side) for side in sides)
    if any(t.startswith("::") for t in (*ref, *other)):   # a run whose junit lost its files (an odd rootdir): by id
        ref, other = (by_id(found) for found in (ref, other))
    for side, found in zip(sides, (ref, other)):
        print(f"{' + '.join(side)}: {len(found)} tests, {dict(sorted(collections.Counter(found.values()).items()))}")
    names = other.keys() if a.ran_only else ref.keys() | other.keys()
    differ = sorted(t for t in names if ref.get(t) != other.get(t))
    for test in differ:
        print(f"  {test}: {ref.get(test, 'absent')} -> {other.get(test, 'absent')}")
    print(f"{len(differ)} tests differ" + (f" (of the {len(other)} the second side ran)" if a.ran_only else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
