#!/usr/bin/env bash
# Set up .venv and .venv-node if needed, then run the whole test suite (unit tests + lab tests on real SSH hosts; needs
# root) on .venv (the newest Python and ansible-core CI runs); the lab nodes run .venv-node's Python (torch).
# The whole suite (no arguments) also proves the oldest end ddpfix claims: scripts/test-oldest.sh (.venv-node:
# the unit tests and the version smoke lab test) runs alongside it, in the background; its output follows the main
# suite's, each line prefixed with "[oldest] ", and the run fails when either fails. DDPFIX_TEST_OLDEST=0 leaves it
# out, DDPFIX_TEST_OLDEST=1 adds it to a run with arguments.
# The whole suite runs in DDPFIX_TEST_WORKERS (default 2) pytest-xdist workers, one test module at a time each
# (--dist loadfile: a module's lab stays with its worker; labs of several workers coexist, each on its own names and
# subnet); 0 or 1 runs it in one process, as a run with arguments does unless it sets DDPFIX_TEST_WORKERS.
set -uo pipefail
. "$(dirname "$0")/as-root.sh" "$@"  # as root as it is; else again through sudo
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
export DDPFIX_LAB_PYTHON=${DDPFIX_LAB_PYTHON:-$PWD/.venv-node/bin/python}  # the lab inventory's ddp_python
oldest_pid=""
if [ "${DDPFIX_TEST_OLDEST:-$([ "$#" -eq 0 ] && echo 1 || echo 0)}" = 1 ]; then
  oldest_log=$(mktemp /tmp/ddpfix-test-oldest.XXXXXX)
  oldest_start=$(date +%s)
  DDPFIX_SETUP_DONE=1 ./scripts/test-oldest.sh >"$oldest_log" 2>&1 </dev/null &
  oldest_pid=$!
fi
workers=${DDPFIX_TEST_WORKERS:-$([ "$#" -eq 0 ] && echo 2 || echo 0)}
parallel=()
if [ "$workers" -gt 1 ] 2>/dev/null; then
  parallel=(-n "$workers" --dist loadfile)
fi
.venv/bin/python -m pytest -q -ra --durations=25 "${parallel[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected" >&2
  rc=1
fi
if [ -n "$oldest_pid" ]; then
  wait "$oldest_pid"
  oldest_rc=$?
  sed 's/^/[oldest] /' "$oldest_log"
  rm -f "$oldest_log"
  echo "[oldest] scripts/test-oldest.sh: rc=$oldest_rc, $(( $(date +%s) - oldest_start ))s"
  [ "$oldest_rc" -eq 0 ] || rc=1
fi
exit "$rc"
