#!/usr/bin/env bash
# The docs site: `mkdocs build --strict` (mkdocs.yml) into build/site/; a broken link, a missing anchor or page, or a
# stale generated region fails it. mkdocs comes with the lint extra (`./scripts/setup.sh --lint`); DOCS_BIN=DIR uses
# the mkdocs in DIR instead of .venv/bin. .ci/run runs it after the lint gates.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${DOCS_BIN:-.venv/bin}
if [ ! -x "$BIN/mkdocs" ]; then
  echo "docs: $BIN/mkdocs not found; run ./scripts/setup.sh --lint" >&2
  exit 2
fi
PY=${DOCS_PYTHON:-$BIN/python}
# the generated pages and regions first: the site must not publish a stale one
if ! PYTHONPATH=controller "$PY" -m tools.generate --check; then
  echo "docs: generated text is stale: PYTHONPATH=controller $PY -m tools.generate" >&2
  exit 1
fi
"$BIN/mkdocs" build --strict --quiet --site-dir build/site && echo "docs: built build/site (mkdocs --strict)"
