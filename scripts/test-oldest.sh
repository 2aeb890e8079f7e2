#!/usr/bin/env bash
# The oldest end of what ddpfix claims (.venv-node, scripts/setup-node.sh: Python 3.11, ansible-core 2.19): the unit
# tests and the version smoke lab test (audit, remediate --apply, verify --torch on 3 nodes). scripts/test.sh runs
# it next to the main suite (after its set-up: DDPFIX_SETUP_DONE=1); on its own: ./scripts/test-oldest.sh [pytest args]
set -uo pipefail
. "$(dirname "$0")/as-root.sh" "$@"  # as root as it is; else again through sudo
cd "$(dirname "$0")/.."
if [ "${DDPFIX_SETUP_DONE:-}" != 1 ]; then
  ./scripts/setup-node.sh || exit 1
fi
args=("$@")
[ "${#args[@]}" -gt 0 ] || args=(tests/unit tests/lab/test_version_smoke_lab.py)
DDPFIX_LAB_PYTHON=$PWD/.venv-node/bin/python DDPFIX_VERSION_SMOKE=1 \
  .venv-node/bin/python -m pytest -q -ra -p no:cacheprovider --durations=5 "${args[@]}"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit "$rc"
