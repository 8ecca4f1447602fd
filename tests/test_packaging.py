"""What a user installing the package meets: the version, the extras' one-line errors, the floors."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement

import optpipe_lightning

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_version_comes_from_the_package_metadata() -> None:
    assert optpipe_lightning.__version__ == version("optpipe-lightning")


def test_strategy_without_torch_is_one_line_naming_the_train_extra() -> None:
    r = _run(
        "import sys\nsys.modules['torch'] = None\n"
        "from optpipe_lightning.strategy import OptPipeStrategy\n"
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: optpipe_lightning.strategy needs torch, which is not installed: "
        "pip install 'optpipe-lightning[train]'"
    )


def test_strategy_without_lightning_names_the_train_extra_and_pytorch_lightning() -> None:
    r = _run(
        "import sys\nsys.modules['lightning'] = None\n"
        "from optpipe_lightning.strategy import OptPipeStrategy\n"
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "pip install 'optpipe-lightning[train]'" in last
    assert "optpipe_lightning.strategy.pytorch_lightning import OptPipeStrategy" in last


def test_inspect_without_streamlit_is_one_line_naming_the_inspector_extra() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nsys.modules['streamlit'] = None\n"
            "from optpipe_lightning.cli import main\nsys.argv = ['optpipe', 'inspect']\nmain()\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "optpipe: error: streamlit is not installed: pip install 'optpipe-lightning[inspector]'"
    )


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("train", "inspector"):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return {r.name.lower(): r for r in reqs}


def test_declared_ranges_exclude_the_releases_known_to_break() -> None:
    # each failed scripts/check_floors.sh (issue 35); raising a floor back must fail here first
    reqs = _requirements()
    broken = {
        "sqlalchemy": ["2.0.0", "2.0.32"],  # dict[str, Any] not mappable: every command fails
        "typer": ["0.12.0", "0.15.4"],  # `str | None`; usage errors as "[WHAT]:[all|...]"
        "numpy": ["1.26.4", "2.0.1"],  # ortools 9.15 needs numpy>=2.0.2
        "pandas": ["2.2.1"],  # built against numpy 1
        "streamlit": ["1.46.0"],  # no server.showEmailPrompt: `optpipe inspect` cannot start
        "torch": ["2.12.0"],  # below what is tested (docs/strategy.md)
    }
    for name, versions in broken.items():
        for v in versions:
            assert not reqs[name].specifier.contains(v), f"{name} {reqs[name].specifier} admits {v}"


def test_upper_bounds_only_where_a_private_api_is_used() -> None:
    # lightning: strategy/lightning/private_api.py; torch: strategy/runtime/torch_adapter.py
    capped = {n for n, r in _requirements().items() if any(s.operator in "<" for s in r.specifier)}
    assert capped == {"lightning", "torch"}


def test_the_license_file_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_readme_links_work_on_the_package_index() -> None:
    # PyPI renders README.md without the repository: a relative link or image would break there
    import re

    relative = re.findall(r"\]\((?!https?://)([^)]+)\)", (ROOT / "README.md").read_text())
    assert relative == []
