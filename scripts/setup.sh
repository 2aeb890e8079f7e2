#!/usr/bin/env bash
# Create .venv with ddpfix and its test/torch extras (torch 2.13.0 CPU, from the local wheel when present).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/apt-deps.sh
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned, so no requirement can pull a newer (multi-GB) build.
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q ".[test,torch]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import ddpfix, ansible_runner, testinfra" >/dev/null
echo "setup: .venv ready ($(.venv/bin/ddpfix --version))"
