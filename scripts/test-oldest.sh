#!/usr/bin/env bash
# The oldest ansible-core ddpfix claims (.venv-oldest, scripts/setup-oldest.sh): the unit tests and the version smoke
# lab test (audit, remediate --apply, verify --torch on 3 nodes). scripts/test.sh runs it next to the main suite;
# on its own: ./scripts/test-oldest.sh [pytest args]
set -uo pipefail
. "$(dirname "$0")/as-root.sh" "$@"  # as root as it is; else again through sudo
cd "$(dirname "$0")/.."
./scripts/setup-oldest.sh || exit 1
args=("$@")
[ "${#args[@]}" -gt 0 ] || args=(tests/unit tests/lab/test_version_smoke_lab.py)
DDPFIX_VERSION_SMOKE=1 .venv-oldest/bin/python -m pytest -q -ra -p no:cacheprovider --durations=5 "${args[@]}"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit "$rc"
