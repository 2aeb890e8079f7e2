#!/usr/bin/env bash
# The lint gates: ruff, mypy --strict (controller/ddpfix), yamllint, ansible-lint (production profile). Runs every
# gate, prints one line per gate, and exits 1 when any gate fails (2 when a tool is missing). Uses the tools in
# .venv, which `./scripts/setup.sh --lint` installs; LINT_BIN=DIR uses the tools in DIR instead.
# Configuration: pyproject.toml ([tool.ruff], [tool.mypy]), .yamllint, .ansible-lint.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${LINT_BIN:-.venv/bin}
for tool in ruff mypy yamllint ansible-lint; do
  if [ ! -x "$BIN/$tool" ]; then
    echo "lint: $BIN/$tool not found; run ./scripts/setup.sh --lint" >&2
    exit 2
  fi
done
BIN=$(cd "$BIN" && pwd)
export PATH="$BIN:$PATH"  # ansible-lint runs ansible-playbook and ansible-galaxy: the same venv's
# ansible-lint resolves ddpfix.cluster.* modules through the collections path: the checkout is that collection
# (playbooks/collections/ansible_collections/ddpfix/cluster links back to it; .ansible-lint keeps the walk out of it).
export ANSIBLE_COLLECTIONS_PATH="$PWD/playbooks/collections"

failed=()
gate() {
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  if "$@"; then
    echo "lint: $name passed ($((SECONDS - start))s)"
  else
    echo "lint: $name FAILED ($((SECONDS - start))s)"
    failed+=("$name")
  fi
}
gate ruff "$BIN/ruff" check --no-cache --output-format concise .
gate mypy "$BIN/mypy" --no-incremental  # files, strictness and overrides: pyproject.toml [tool.mypy]
gate yamllint "$BIN/yamllint" --strict -f parsable .
# --offline: the collection has no dependencies to install, and CI must not need the network.
gate ansible-lint "$BIN/ansible-lint" --offline --nocolor -f pep8

if [ ${#failed[@]} -gt 0 ]; then
  echo "lint: FAILED: ${failed[*]}"
  exit 1
fi
echo "lint: all gates passed"
