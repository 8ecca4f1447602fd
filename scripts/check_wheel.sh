#!/usr/bin/env bash
# Build the sdist and the wheel (`python -m build`: the wheel is built FROM the sdist, so a file
# missing from the sdist fails here), check that the sdist holds what its tests and examples
# need, install the wheel into a fresh venv OUTSIDE the checkout and run the installed smoke test
# there (scripts/smoke_installed.py): CLI, compare on a shipped example, db round trip, the
# inspector's health endpoint, a 2-process fit.
#
#   bash scripts/check_wheel.sh             # ~3-4 min on 2 cores with a warm cache
# Env: OPTPIPE_WHEEL_DIR (default: a new temp dir). Installs go through uv (its cache is reused;
# pip took ~5 min for the same install on this machine); torch is the CPU wheel constraints.txt
# pins, from pip's local wheel folder.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${OPTPIPE_WHEEL_DIR:-$(mktemp -d /tmp/optpipe-wheel.XXXXXX)}"
case "$WORK" in "$ROOT"/*) echo "check_wheel: $WORK is inside the checkout" >&2; exit 2 ;; esac
mkdir -p "$WORK"
rm -rf "$WORK/dist" "$WORK/venv"
# pip's configured local wheel folder (uv does not read pip's config): torch's CPU wheel lies there
WHEELS="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)}"
if command -v uv >/dev/null 2>&1; then UV=uv; else
  [ -x "$WORK/tools/bin/uv" ] || { python3 -m venv "$WORK/tools" && "$WORK/tools/bin/pip" install -q uv; }
  UV="$WORK/tools/bin/uv"
fi
TORCH="$(grep -E '^torch==' "$ROOT/constraints.txt" | cut -d= -f3)"
echo "torch==$TORCH+cpu" > "$WORK/constraints.txt"

python3 -m venv --without-pip "$WORK/venv"
PIP_CONFIG_FILE=/dev/null "$UV" pip install -q --python "$WORK/venv/bin/python" build
echo "check_wheel: building the sdist and the wheel into $WORK/dist"
"$WORK/venv/bin/python" -m build -q --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
SDIST="$(ls "$WORK"/dist/optpipe_lightning-*.tar.gz)"
WHEEL="$(ls "$WORK"/dist/optpipe_lightning-*.whl)"
ls -l "$SDIST" "$WHEEL"

tar tzf "$SDIST" > "$WORK/sdist.txt"
for f in LICENSE README.md constraints.txt pyproject.toml examples/train_gpt.py \
  examples/problems/tiny-4x8.json tests/conftest.py docs/strategy.md scripts/smoke_installed.py; do
  grep -q "^optpipe_lightning-[^/]*/$f\$" "$WORK/sdist.txt" || { echo "check_wheel: sdist lacks $f" >&2; exit 1; }
done
"$WORK/venv/bin/python" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
text = zipfile.ZipFile(sys.argv[1]).read(meta).decode()
need = ["License-Expression: Apache-2.0", "License-File: LICENSE", "Project-URL: ", "Classifier: "]
missing = [n for n in need if n not in text]
lic = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
migrations = [n for n in names if "profiles_db/migrations/versions/" in n]
if missing or not lic or not migrations:
    sys.exit(f"check_wheel: wheel metadata lacks {missing}, licence file {bool(lic)}, migrations {bool(migrations)}")
print("check_wheel: wheel metadata and files ok")
EOF

echo "check_wheel: installing the wheel with [train,inspector] into $WORK/venv"
PIP_CONFIG_FILE=/dev/null "$UV" pip install -q --python "$WORK/venv/bin/python" \
  --find-links "$WHEELS" -c "$WORK/constraints.txt" "$WHEEL[train,inspector]"
cd "$WORK"
"$WORK/venv/bin/python" "$ROOT/scripts/smoke_installed.py" --examples "$ROOT/examples" --inspector --fit
echo "check_wheel: passed"
