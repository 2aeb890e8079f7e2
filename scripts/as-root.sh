# Sourced by the scripts that need root (demo.sh, test.sh, apt-deps.sh): as root, nothing happens (sudo is never
# called, so a root-only machine without sudo works); as another user, the calling script runs again through sudo,
# with its arguments and the DDPFIX_* / PYTHON settings it reads (never the caller's state directory: root keeps its
# own, ddpfix refuses one that is not root's); without sudo, exit 4 with one line.
# Usage: . "$(dirname "$0")/as-root.sh" "$@"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo --preserve-env=DDPFIX_DEMO_SCENARIOS,PYTHON -- "$(readlink -f "$0")" "$@"
  fi
  echo "$(basename "$0"): needs root: run it as root, or as a user with sudo" >&2
  exit 4
fi
