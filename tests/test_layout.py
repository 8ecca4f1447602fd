"""DESIGN.md's dependency rule: arrows point one way between the package's parts."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import optpipe_lightning

ROOT = Path(optpipe_lightning.__file__).parent
PARTS = ("schedule", "solver", "profiles_db", "strategy", "inspector")
ALLOWED = {
    "schedule": set(),
    "solver": {"schedule"},
    "profiles_db": {"schedule"},
    "strategy": {"schedule", "solver", "profiles_db"},
    "inspector": {"schedule", "profiles_db"},
}


def imported_parts(path: Path) -> set[str]:
    """Parts of optpipe_lightning a module imports (absolute or relative)."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = ["optpipe_lightning", *rel.parts[:-1]]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names = [".".join([*base, node.module]) if node.module else ".".join(base)]
                if not node.module:
                    names = [f"{names[0]}.{a.name}" for a in node.names]
            elif node.module:
                names = [node.module]
        for name in names:
            bits = name.split(".")
            if bits[0] == "optpipe_lightning" and len(bits) > 1 and bits[1] in PARTS:
                found.add(bits[1])
            elif bits[0] == "optpipe_lightning" and len(bits) > 1 and bits[1] == "cli":
                found.add("cli")
    return found


@pytest.mark.parametrize("part", PARTS)
def test_parts_import_only_what_design_allows(part: str) -> None:
    bad = {}
    for path in sorted((ROOT / part).rglob("*.py")):
        extra = imported_parts(path) - ALLOWED[part] - {part}
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"{part}/ may import only {sorted(ALLOWED[part])}: {bad}"


def test_importing_the_package_and_the_inspector_never_imports_torch() -> None:
    code = (
        "import sys, optpipe_lightning, optpipe_lightning.cli, optpipe_lightning.inspector.charts;"
        "import optpipe_lightning.profiles_db, optpipe_lightning.solver;"
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
