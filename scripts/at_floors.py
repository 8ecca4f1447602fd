"""Fail unless each direct dependency (base, [train], [inspector]) is installed at its declared floor.

    python3 scripts/at_floors.py pyproject.toml freeze.txt

Used by scripts/check_floors.sh after uv's lowest-direct install: a dependency above its floor
means the floor cannot install together with the others, so it is not tested (raise it).
"""

from __future__ import annotations

import re
import sys
import tomllib


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _release(version: str) -> list[int]:
    parts = [int(x) for x in version.split("+")[0].split(".")]
    return parts + [0] * (3 - len(parts))


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    reqs = [*project["dependencies"], *extras["train"], *extras["inspector"]]
    installed: dict[str, str] = {}
    with open(sys.argv[2]) as f:
        for line in f:
            if "==" in line:
                name, version = line.strip().split("==", 1)
                installed[_name(name)] = version
    wrong = []
    for req in reqs:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", req)
        if m is None:
            continue
        name, floor = _name(m[1]), m[2]
        got = installed.get(name)
        if got is None or _release(got) != _release(floor):
            wrong.append(f"{name}: declared >={floor}, installed {got}")
    if wrong:
        sys.exit(
            "at_floors: not at the declared floor (raise it to what installs): " + "; ".join(wrong)
        )
    print(f"at_floors: all {len(reqs)} direct dependencies at their declared floors")


if __name__ == "__main__":
    main()
