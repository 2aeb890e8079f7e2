#!/usr/bin/env bash
# Create .venv-node: ddpfix with the test and torch extras (torch 2.13.0 CPU, from the local wheel when present) on
# Python 3.11 outside /root (Debian 12's /usr/bin/python3) and on the OLDEST ansible-core ddpfix claims (2.19, with the
# collections of the `ansible` 12 package). Two uses: the lab nodes' interpreter with torch (lab nodes have a private
# /root, so no interpreter under /root/.pyenv runs inside them; scripts/demo.sh and scripts/test.sh set
# DDPFIX_LAB_PYTHON to it: the lab inventory's ddp_python), and the controller of scripts/test-oldest.sh (the oldest
# end of the claim). The controller's own .venv (scripts/setup.sh) runs the newest.
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST_PYTHON=3.11
OLDEST_CORE="ansible-core==2.19.*"
OLDEST_ANSIBLE="ansible==12.*"
PY=${NODE_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import sys, venv; sys.exit(sys.version_info[:2] != tuple(map(int, '$OLDEST_PYTHON'.split('.'))))"; then
  echo "setup-node: $PY is not Python $OLDEST_PYTHON (set NODE_PYTHON to a Python $OLDEST_PYTHON outside /root)" >&2
  exit 1
fi
if [ ! -x .venv-node/bin/python ]; then
  "$PY" -m venv .venv-node
fi
.venv-node/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned, so no requirement can pull a newer (multi-GB) build.
.venv-node/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
.venv-node/bin/python -m pip install -q ".[test,torch]" "$OLDEST_CORE" "$OLDEST_ANSIBLE" 2>&1 \
  | grep -v '^WARNING: Location' || true
# this checkout's ddpfix, also when .venv-node holds an earlier build of the same version
.venv-node/bin/python -m pip install -q --no-deps --force-reinstall . 2>&1 | grep -v '^WARNING: Location' || true
.venv-node/bin/python -c "import ddpfix, ansible_runner, testinfra, torch" >/dev/null
core=$(.venv-node/bin/python -c 'import ansible.release; print(ansible.release.__version__)')
case "$core" in
  2.19.*) ;;
  *) echo "setup-node: expected ansible-core 2.19.x in .venv-node, got $core" >&2; exit 1 ;;
esac
echo "setup-node: .venv-node ready (Python $OLDEST_PYTHON, ansible-core $core, torch $(.venv-node/bin/python -c 'import torch; print(torch.__version__)'))"
