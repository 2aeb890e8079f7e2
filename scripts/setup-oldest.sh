#!/usr/bin/env bash
# Create .venv-oldest: ddpfix on the OLDEST ansible-core it claims (pyproject.toml's lower bound: ansible-core 2.17
# with the collections of the `ansible` 10 package), for scripts/test-oldest.sh. The main .venv (scripts/setup.sh)
# keeps the newest supported ansible-core. torch 2.13.0 CPU as in .venv (the local wheel when present).
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST_CORE="ansible-core==2.17.*"
OLDEST_ANSIBLE="ansible==10.*"
if [ -z "${PYTHON:-}" ] && /usr/bin/python3 -c 'import sys, venv; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  PYTHON=/usr/bin/python3
fi
PY=${PYTHON:-python3}
if [ ! -x .venv-oldest/bin/python ]; then
  "$PY" -m venv .venv-oldest
fi
.venv-oldest/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv-oldest/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
.venv-oldest/bin/python -m pip install -q ".[test,torch]" "$OLDEST_CORE" "$OLDEST_ANSIBLE" 2>&1 \
  | grep -v '^WARNING: Location' || true
# this checkout's ddpfix, also when .venv-oldest holds an earlier build of the same version
.venv-oldest/bin/python -m pip install -q --no-deps --force-reinstall . 2>&1 | grep -v '^WARNING: Location' || true
.venv-oldest/bin/python -c "import ddpfix, ansible_runner, testinfra" >/dev/null
core=$(.venv-oldest/bin/python -c 'import ansible.release; print(ansible.release.__version__)')
case "$core" in
  2.17.*) ;;
  *) echo "setup-oldest: expected ansible-core 2.17.x in .venv-oldest, got $core" >&2; exit 1 ;;
esac
echo "setup-oldest: .venv-oldest ready ($(.venv-oldest/bin/ddpfix --version), ansible-core $core)"
