"""Compare two pytest junit XML files test by test: the outcome of every test (passed, failed, skipped, xfailed).

    python bench/compare_junit.py docs/data/liger_suite-h200-jit_cold.xml docs/data/liger_suite-h200-served.xml

Prints each file's counts and every test whose outcome differs (or that only one file has); exits 1 if any does.
Used to show that a test suite served from kforge bundles ends exactly as it does on Triton's JIT.
"""
from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "xfailed" if "xfail" in (kinds["skipped"].get("type") or "") else "skipped"
        else:
            outcome = "passed"
        found[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.exit("usage: python bench/compare_junit.py REFERENCE.xml OTHER.xml")
    ref, other = (outcomes(p) for p in argv)
    for path, found in zip(argv, (ref, other)):
        print(f"{path}: {len(found)} tests, {dict(sorted(collections.Counter(found.values()).items()))}")
    differ = sorted(t for t in ref.keys() | other.keys() if ref.get(t) != other.get(t))
    for test in differ:
        print(f"  {test}: {ref.get(test, 'absent')} -> {other.get(test, 'absent')}")
    print(f"{len(differ)} tests differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
