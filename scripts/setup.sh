#!/usr/bin/env bash
# Create .venv with ddpfix and its test/torch extras (torch 2.13.0 CPU, from the local wheel when present).
# --lint also installs the lint extra (ruff, mypy, yamllint, ansible-lint at the versions pyproject.toml pins),
# which scripts/lint.sh and .ci/run use.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,torch
case "${1:-}" in
  --lint) EXTRAS=test,torch,lint ;;
  "") ;;
  *) echo "usage: $0 [--lint]" >&2; exit 2 ;;
esac
./scripts/apt-deps.sh
# Prefer the system interpreter: lab nodes have a private /root, so a venv built on a Python under /root
# (pyenv) would not run inside them (verify --torch runs the venv's python on the nodes).
if [ -z "${PYTHON:-}" ] && /usr/bin/python3 -c 'import sys, venv; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  PYTHON=/usr/bin/python3
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned, so no requirement can pull a newer (multi-GB) build.
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q ".[$EXTRAS]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import ddpfix, ansible_runner, testinfra" >/dev/null
if [ "$EXTRAS" = test,torch,lint ]; then
  for tool in ruff mypy yamllint ansible-lint; do .venv/bin/$tool --version >/dev/null; done
fi
echo "setup: .venv ready ($(.venv/bin/ddpfix --version))"
