"""Print where a test run's time went, from its JUnit XML files (pytest's --junitxml).

The run's wall time is given by the caller (the parallel workers overlap, so the tests' times add
up to more than it); then each area's (tests/<area>/) test count and summed time, the ten
slowest tests, and the count of passed, failed (or in error) and skipped tests of all the files.
Every test's time stays in the XML files, the CI artifact.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _area(classname: str) -> str:
    """`tests.app.test_hub.TestX` -> `app`; a test module at the top of tests/ -> `(top)`."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 2 and not parts[1].startswith("test_") else "(top)"


def _node_id(classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case: `tests.app.test_x.TestY` + `test_z[p]` ->
    `tests/app/test_x.py::TestY::test_z[p]` (the module is the longest prefix that is a file)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        if (REPO / Path(*parts[:cut])).with_suffix(".py").is_file():
            return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])
    return f"{classname}::{name}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("xml", nargs="+", type=Path, help="JUnit XML files of the run")
    parser.add_argument("--wall", type=float, required=True, help="the run's wall time, seconds")
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument(
        "--write-long",
        type=Path,
        help="write the tests of at least 30 s here (tests/long_tests.txt: started first)",
    )
    args = parser.parse_args(argv)
    cases: list[tuple[float, str, str]] = []
    outcomes = {"passed": 0, "failed": 0, "skipped": 0}
    for path in args.xml:
        if not path.exists():
            print(f"test times: {path} is missing (its pytest run ended before writing it)")
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            classname = case.get("classname", "")
            name = _node_id(classname, case.get("name", ""))
            cases.append((float(case.get("time", "0")), _area(classname), name))
            if case.find("failure") is not None or case.find("error") is not None:
                outcomes["failed"] += 1
            elif case.find("skipped") is not None:
                outcomes["skipped"] += 1
            else:
                outcomes["passed"] += 1
    total = sum(time for time, _, _ in cases)
    per_area: dict[str, list[float]] = defaultdict(list)
    for time, area, _ in cases:
        per_area[area].append(time)
    print(
        f"test times: {len(cases)} tests, {args.wall / 60:.1f} min of wall time, "
        f"{total / 60:.1f} min of test time ({total / max(args.wall, 1e-9):.1f} tests at once "
        "on average)"
    )
    print(f"  {'area':<10} {'tests':>6} {'minutes':>8}")
    for area, times in sorted(per_area.items(), key=lambda item: -sum(item[1])):
        print(f"  {area:<10} {len(times):>6} {sum(times) / 60:>8.1f}")
    print(f"the {args.slowest} slowest tests:")
    for time, _, name in sorted(cases, reverse=True)[: args.slowest]:
        print(f"  {time:7.1f} s  {name}")
    if args.write_long:
        long = sorted((time, name) for time, _, name in cases if time >= 30.0)
        args.write_long.write_text(
            "# Tests of 30 s or more in a measured run (scripts/test_times.py --write-long):\n"
            "# pytest-xdist's workers start them first (tests/conftest.py). Seconds, test.\n"
            + "".join(f"{time:.0f} {name}\n" for time, name in reversed(long))
        )
    # The whole run's count, the parallel and the serial pytest runs together, as the last line.
    print(
        f"tests: {outcomes['passed']} passed, {outcomes['failed']} failed, "
        f"{outcomes['skipped']} skipped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
