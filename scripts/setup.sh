#!/usr/bin/env bash
# One-command setup on a fresh Debian machine with Python 3.11: the package with every extra,
# the test tools, Debian's chromium (browser tests) and PostgreSQL (database tests).
# Idempotent; run as root or with sudo available for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --upgrade pip >/dev/null
# constraints.txt pins torch to the CPU build (a plain "torch" would pull a multi-GB CUDA build).
python3 -m pip install -c constraints.txt -e ".[train,inspector,gurobi,highs,postgres,hf,dev]"

APT=""
if [ "$(id -u)" -eq 0 ]; then APT="apt-get"; elif command -v sudo >/dev/null; then APT="sudo apt-get"; fi
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)  # the server, not just psql
if [ ${#need[@]} -gt 0 ]; then
  if [ -n "$APT" ]; then
    $APT update -qq && DEBIAN_FRONTEND=noninteractive $APT install -y -qq "${need[@]}" >/dev/null \
      || echo "setup: could not install ${need[*]}; the tests that need them will skip"
  else
    echo "setup: no root and no sudo: ${need[*]} not installed; the tests that need them will skip"
  fi
fi
echo "setup: done"
