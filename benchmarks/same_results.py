"""Whether two `slorouter bench` runs produced the same figures (wall-clock times and the command aside).

Used to check that a refactoring leaves fixed-seed benchmark results unchanged:

    .venv/bin/python benchmarks/same_results.py before/results.json after/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# Keys whose values depend on the machine or the invocation, not on the simulation.
IGNORED = frozenset({"sim_wall_s", "wall_s", "command"})


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    if type(before) is not type(after):
        return [f"{path}: {before!r} → {after!r}"]
    if isinstance(before, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            if key in IGNORED:
                continue
            if key not in before or key not in after:
                found.append(f"{path}/{key}: only in {'after' if key in after else 'before'}")
            else:
                found += differences(before[key], after[key], f"{path}/{key}")
        return found
    if isinstance(before, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} items → {len(after)}"]
        return [
            d
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for d in differences(b, a, f"{path}[{i}]")
        ]
    return [] if before == after else [f"{path}: {before!r} → {after!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args()
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    found = differences(before, after)
    for line in found:
        print(line)
    print("identical" if not found else f"{len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
