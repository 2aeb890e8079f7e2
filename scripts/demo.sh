#!/usr/bin/env bash
# The ddpfix story on the built-in lab: a broken 3-node cluster, audited, failing a real all-reduce,
# remediated, passing it, torn down. Needs root (network namespaces). Sets itself up on a fresh machine.
set -uo pipefail
. "$(dirname "$0")/as-root.sh" "$@"  # as root as it is; else again through sudo
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
DDPFIX=.venv/bin/ddpfix
# verify --torch runs this interpreter (with torch) on the lab's nodes: the controller's .venv has no torch
export DDPFIX_LAB_PYTHON=$PWD/.venv-node/bin/python
LAB=demo
INV=inventories/lab/hosts.yml
SCENARIOS=${DDPFIX_DEMO_SCENARIOS:-firewalld-master,hostname-loopback,peer-mismatch,chrony-absent,env-wrong}
export DDPFIX_STATE_DIR=${DDPFIX_STATE_DIR:-/run/ddpfix-demo-state}

step() { printf '\n\033[1m== %s\033[0m\n%s\n\n' "$1" "$2"; }
cleanup() { step "tear down" "ddpfix lab down removes every namespace, link, mount and process the lab made."; $DDPFIX lab down --name "$LAB"; }
trap cleanup EXIT

step "1/7 a broken cluster" "Three real SSH hosts in network namespaces, with: $SCENARIOS."
$DDPFIX lab up --name "$LAB" --nodes 3 --scenario "$SCENARIOS" --no-wait-sync || exit 1

step "2/7 audit" "One read-only pass over every node plus TCP probes between them; each finding names the host, the evidence and the fix."
$DDPFIX audit -i "$INV" --matrix
echo "(audit exit code: $? - 1 means findings)"

step "3/7 verify --torch (expected to FAIL)" "A real torch.distributed Gloo all-reduce via torchrun, from the env files the nodes have now."
$DDPFIX verify -i "$INV" --torch --no-checks
echo "(verify exit code: $?)"

step "4/7 remediate (dry run)" "Every change ddpfix would make, as diffs; nothing is touched."
$DDPFIX remediate -i "$INV"
echo "(dry-run exit code: $? - 1 means changes pending)"

step "5/7 remediate --apply" "Firewall opened to the cluster CIDR only, /etc/hosts block, chrony, env files; then a re-audit."
$DDPFIX remediate -i "$INV" --apply
rc=$?
echo "(apply exit code: $rc - 0 means no fixable finding remains)"

step "6/7 audit again" "Clean at error level: what remains (if anything) is not auto-fixable and says how to fix it by hand."
$DDPFIX audit -i "$INV" --fail-on error
echo "(audit exit code: $?)"

step "7/7 verify --torch (expected to PASS)" "The same all-reduce, now across every node."
$DDPFIX verify -i "$INV" --torch
vrc=$?
echo "(verify exit code: $vrc)"
[ "$rc" -eq 0 ] && [ "$vrc" -eq 0 ] && echo "demo: OK" || { echo "demo: FAILED"; exit 1; }
