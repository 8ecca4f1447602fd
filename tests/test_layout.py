"""DESIGN.md's dependency rule: arrows point one way between the package's parts."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import optpipe_lightning

ROOT = Path(optpipe_lightning.__file__).parent
PARTS = ("schedule", "solver", "profiles_db", "strategy", "inspector", "cli")
ALLOWED = {
    "schedule": set(),
    "solver": {"schedule"},
    "profiles_db": {"schedule"},
    "strategy": {"schedule", "solver", "profiles_db"},
    "inspector": {"schedule", "profiles_db"},
    "cli": {"schedule", "solver", "profiles_db", "inspector"},
}
# strategy/'s rooms, top to bottom: a room imports only the rooms below it (docs/architecture.md)
ROOMS = ("lightning", "scheduling", "records", "runtime", "planning")


def imported_modules(path: Path) -> set[str]:
    """Dotted names a module imports (relative ones made absolute; ``from a import b`` gives
    ``a`` and ``a.b``), wherever the import stands (lazy and ``TYPE_CHECKING`` ones too)."""
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
            if node.module:
                names += [f"{names[0]}.{a.name}" for a in node.names]
        found.update(names)
    return found


def imported_parts(path: Path) -> set[str]:
    """Parts of optpipe_lightning a module imports (absolute or relative)."""
    found: set[str] = set()
    for name in imported_modules(path):
        bits = name.split(".")
        if bits[0] == "optpipe_lightning" and len(bits) > 1 and bits[1] in PARTS:
            found.add(bits[1])
    return found


@pytest.mark.parametrize("part", PARTS)
def test_parts_import_only_what_design_allows(part: str) -> None:
    bad = {}
    for path in sorted((ROOT / part).rglob("*.py")):
        extra = imported_parts(path) - ALLOWED[part] - {part}
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"{part}/ may import only {sorted(ALLOWED[part])}: {bad}"


def test_the_package_root_holds_only_what_every_part_shares() -> None:
    # (__main__.py: `python -m optpipe_lightning` runs the command; Python looks for it there)
    loose = sorted(
        p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert not loose, (
        f"modules at the package root belong in a part (cli/ for the command): {loose}"
    )
    parts = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
    assert parts == sorted(PARTS), parts


def imported_rooms(path: Path) -> set[str]:
    """strategy/'s rooms a module imports; "strategy" for the package itself (its face)."""
    found: set[str] = set()
    for name in imported_modules(path):
        bits = name.split(".")
        if bits[:2] != ["optpipe_lightning", "strategy"]:
            continue
        found.add(bits[2] if len(bits) > 2 and bits[2] in ROOMS else "strategy")
    return found


def test_strategy_is_in_rooms() -> None:
    loose = sorted(p.name for p in (ROOT / "strategy").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"strategy/ modules belong in a room {ROOMS}: {loose}"
    rooms = sorted(p.name for p in (ROOT / "strategy").iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(ROOMS), rooms


@pytest.mark.parametrize("room", ROOMS)
def test_strategy_rooms_import_only_the_rooms_below(room: str) -> None:
    below = set(ROOMS[ROOMS.index(room) + 1 :])
    bad = {}
    for path in sorted((ROOT / "strategy" / room).rglob("*.py")):
        extra = imported_rooms(path) - below - {room}
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"strategy/{room}/ may import only {sorted(below)}: {bad}"


def test_planning_never_imports_torch() -> None:
    bad = {
        str(path.relative_to(ROOT)): sorted(
            n for n in imported_modules(path) if n.split(".")[0] in ("torch", "lightning")
        )
        for path in sorted((ROOT / "strategy" / "planning").rglob("*.py"))
    }
    assert not any(bad.values()), bad


def import_graph(part: str) -> dict[str, set[str]]:
    """Module -> the modules of the same part it imports (a package counts as its __init__)."""
    files = {}
    for path in (ROOT / part).rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("").parts
        files[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        graph[name] = {m for m in imported_modules(path) if m in files and m != name}
    return graph


@pytest.mark.parametrize("part", ["cli", "strategy", "solver"])
def test_no_import_circles(part: str) -> None:
    graph = import_graph(part)
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError(
                "import circle: " + " -> ".join([*trail[trail.index(name) :], name])
            )
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def face_imports(path: Path, package: Path) -> list[str]:
    """The names a module inside ``package`` takes from the package's ``__init__`` itself (its
    re-exports), not from a submodule: ``from . import solve`` where ``solve`` is what
    ``__init__`` binds (there a function shadowing the module), ``from <package> import X``."""
    dotted = ".".join(package.relative_to(ROOT.parent).parts)
    own = {p.stem for p in package.glob("*.py")} | {
        p.name for p in package.iterdir() if (p / "__init__.py").exists()
    }
    face = {
        a.asname or a.name
        for node in ast.parse((package / "__init__.py").read_text()).body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    depth = len(path.relative_to(package).parts)  # 1: a module of the package itself
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if (node.level == depth and not node.module) or node.module == dotted:
            found += [a.name for a in node.names if a.name in face or a.name not in own]
    return found


@pytest.mark.parametrize("part", ["solver"])
def test_modules_of_a_part_never_import_its_face(part: str) -> None:
    # the face (__init__) imports the modules; one of them importing the face back is a circle
    # that works only while that import stays lazy
    package = ROOT / part
    bad = {
        str(path.relative_to(ROOT)): names
        for path in sorted(package.rglob("*.py"))
        if path.name != "__init__.py" and (names := face_imports(path, package))
    }
    assert not bad, f"import these from the module that defines them, not from {part}/: {bad}"


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
