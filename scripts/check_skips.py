#!/usr/bin/env python3
"""Fails a test run in which a test was skipped for any reason but a missing GPU.

Usage: check_skips.py CTEST_JUNIT_XML   (ctest --output-junit FILE)

Prints how many tests ctest skipped, with each one's name and reason. Only a missing GPU may
skip a test: such a skip says so with the marker "[no GPU]" (tests/unit/gpu_skip.h,
EASEL_SKIP_WITHOUT_GPU). Any other skipped test (a test that could not get its data, its
rpc-servers, ...) makes the exit status 1, so coverage cannot disappear while CI stays green.
"""
import sys
import xml.etree.ElementTree as ET

MARKER = "[no GPU]"


def reason(case):
    """The skip message: gtest's line after "Skipped", else ctest's skipped message."""
    out = case.findtext("system-out") or ""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1].strip()
    for line in lines:
        if MARKER in line:
            return line.strip()
    sk = case.find("skipped")
    return (sk.get("message") if sk is not None else "") or "(no reason given)"


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"check_skips: cannot read {sys.argv[1]}: {e}")
        return 1
    skipped = [c for c in root.iter("testcase") if c.get("status") in ("notrun", "disabled") or c.find("skipped") is not None]
    total = sum(1 for _ in root.iter("testcase"))
    bad = []
    print(f"ctest: {len(skipped)} of {total} tests skipped")
    for c in skipped:
        r = reason(c)
        ok = MARKER in r
        print(f"  {'skipped' if ok else 'SKIPPED'} {c.get('name')}: {r}")
        if not ok:
            bad.append(c.get("name"))
    if bad:
        print(f"check_skips: {len(bad)} test(s) skipped for a reason other than a missing GPU ({MARKER}): "
              + ", ".join(bad) + ". A test that cannot get what it needs must fail, not skip.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
