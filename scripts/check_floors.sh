#!/usr/bin/env bash
# Every declared lower bound, installed together: a fresh venv OUTSIDE the checkout, the package
# with its [train,inspector] extras resolved by uv with `--resolution lowest-direct` (each direct
# dependency at its floor, the rest at their newest compatible release), then the installed smoke
# test (scripts/smoke_installed.py): CLI, compare, db round trip, inspector health, a 2-process
# fit. Fails too when a direct dependency is not installed at its floor (scripts/at_floors.py).
#
# torch is the one exception: only the CPU wheels on this machine's local wheel folder may be
# installed (every other torch on PyPI is a multi-GB CUDA build), so torch is pinned to
# $OPTPIPE_FLOORS_TORCH (default 2.13.0+cpu, the floor we declare); docs/strategy.md says so.
#
#   bash scripts/check_floors.sh            # ~3-6 min on 2 cores with a warm cache
# Env: OPTPIPE_FLOORS_DIR (default: a new temp dir), UV_CACHE_DIR (reused between runs).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${OPTPIPE_FLOORS_DIR:-$(mktemp -d /tmp/optpipe-floors.XXXXXX)}"
TORCH="${OPTPIPE_FLOORS_TORCH:-2.13.0+cpu}"
# pip's configured local wheel folder (uv does not read pip's config): torch's CPU wheel lies there
WHEELS="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)}"
case "$WORK" in "$ROOT"/*) echo "check_floors: $WORK is inside the checkout" >&2; exit 2 ;; esac
mkdir -p "$WORK"

if command -v uv >/dev/null 2>&1; then UV=uv; else
  [ -x "$WORK/tools/bin/uv" ] || { python3 -m venv "$WORK/tools" && "$WORK/tools/bin/pip" install -q uv; }
  UV="$WORK/tools/bin/uv"
fi

rm -rf "$WORK/venv"
python3 -m venv --without-pip "$WORK/venv"
echo "torch==$TORCH" > "$WORK/constraints.txt"
echo "check_floors: resolving the lowest direct versions into $WORK/venv"
# only what uv resolves from PyPI plus the local wheel folder; no pip config, no other indexes
PIP_CONFIG_FILE=/dev/null "$UV" pip install -q --python "$WORK/venv/bin/python" \
  --resolution lowest-direct --find-links "$WHEELS" -c "$WORK/constraints.txt" \
  "$ROOT[train,inspector]"
"$UV" pip freeze --python "$WORK/venv/bin/python" > "$WORK/freeze.txt"
echo "check_floors: installed (direct dependencies):"
grep -i -E '^(numpy|pydantic|typer|rich|ortools|sqlalchemy|alembic|torch|lightning|streamlit|altair|pandas|click)==' \
  "$WORK/freeze.txt" | tr '\n' ' '
echo
python3 "$ROOT/scripts/at_floors.py" "$ROOT/pyproject.toml" "$WORK/freeze.txt"
cd "$WORK"
"$WORK/venv/bin/python" "$ROOT/scripts/smoke_installed.py" --examples "$ROOT/examples" --inspector --fit
echo "check_floors: passed"
