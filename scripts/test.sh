#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (unit tests + lab tests on real SSH hosts; needs root).
set -uo pipefail
. "$(dirname "$0")/as-root.sh" "$@"  # as root as it is; else again through sudo
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q -ra --durations=25 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit "$rc"
