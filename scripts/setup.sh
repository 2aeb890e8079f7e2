#!/usr/bin/env bash
# Create .venv, the controller's venv: ddpfix and its test extra on the NEWEST Python and ansible-core that CI runs
# (Python 3.13 from pyenv, ansible-core 2.21 with the `ansible` package's collections), then .venv-node
# (scripts/setup-node.sh: Python 3.11 with torch 2.13.0 CPU, the lab nodes' interpreter and the oldest end).
# torch is not in .venv: `verify --torch` runs torch on the nodes (ddp_python), and no CPU wheel is at hand for 3.13.
# --lint also installs the lint extra (ruff, mypy, yamllint, ansible-lint and mkdocs at the versions pyproject.toml
# pins), which scripts/lint.sh, scripts/docs.sh and .ci/run use. PYTHON=... picks another controller interpreter (>= 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
NEWEST_PYTHON=3.13
NEWEST_CORE="ansible-core==2.21.*"
EXTRAS=test
case "${1:-}" in
  --lint) EXTRAS=test,lint ;;
  "") ;;
  *) echo "usage: $0 [--lint]" >&2; exit 2 ;;
esac
./scripts/apt-deps.sh
if [ -z "${PYTHON:-}" ]; then
  # pyenv's build itself (its shim fails unless pyenv selects that version), else one on PATH
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$NEWEST_PYTHON.*/bin/python$NEWEST_PYTHON \
           "$(command -v "python$NEWEST_PYTHON" || true)"; do
    if [ -x "$p" ] && "$p" -c "import venv" 2>/dev/null; then PYTHON=$p; break; fi
  done
fi
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  echo "setup: no Python $NEWEST_PYTHON (pyenv install $NEWEST_PYTHON, or PYTHON=...): .venv uses $(command -v python3)" >&2
fi
core_pin=()
if "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] < (3, 12))"; then
  core_pin=("$NEWEST_CORE")  # ansible-core 2.20 and later need Python >= 3.12
fi
want=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
have=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  "$PYTHON" -m venv --clear .venv  # none yet, or one of another Python (an earlier checkout's 3.11 .venv)
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q ".[$EXTRAS]" "${core_pin[@]}" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import ddpfix, ansible_runner, testinfra" >/dev/null
if [ "$EXTRAS" = test,lint ]; then
  for tool in ruff mypy yamllint ansible-lint mkdocs; do .venv/bin/$tool --version >/dev/null; done
fi
echo "setup: .venv ready ($(.venv/bin/ddpfix --version | tr '\n' ' '))"
./scripts/setup-node.sh
