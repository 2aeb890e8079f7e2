#!/usr/bin/env bash
# torchrun on every node of a Slurm allocation, after ddpfix has checked the nodes, from ddpfix's env files.
#
#   examples/torchrun.sh train.py [ARGS...]      # once, inside the allocation (examples/slurm/train.sbatch does it)
#
#   1. ddpfix audit --slurm       checks this allocation's nodes (SLURM_JOB_NODELIST) before the job burns its
#                                 queue time; findings at or above a warning stop the job here (exit 1).
#   2. ddpfix env --slurm --apply writes each node's env file (rank = its place in the node list, the master is the
#                                 first node) and cluster.json, which `ddpfix check --local` reads.
#   3. srun, one task per node:   each task sources its node's env file and starts a bare `torchrun SCRIPT`:
#                                 torchrun reads PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and
#                                 PET_MASTER_PORT from the environment (no flags to get wrong).
#
# This file must be readable on every node (a shared file system), since srun runs it there with --on-node.
# Environment: DDPFIX (the ddpfix command; default ddpfix), DDPFIX_INVENTORY (site variables: how to reach the
# nodes, ddp_cluster_cidr, ...), DDPFIX_ENV_FILE (default /etc/ddpfix/ddp.env, as ddp_env_path), TORCHRUN
# (default torchrun), SRUN (default srun).
set -euo pipefail

env_file=${DDPFIX_ENV_FILE:-/etc/ddpfix/ddp.env}

on_node() {  # step 3, on one node: what each srun task runs
    if [ ! -r "$env_file" ]; then
        echo "$(hostname): $env_file is missing: run \`ddpfix env --slurm --apply\` first" >&2
        exit 2
    fi
    set -a
    . "$env_file"
    set +a
    exec ${TORCHRUN:-torchrun} --max-restarts=0 "$@"
}

if [ "${1:-}" = "--on-node" ]; then
    shift
    on_node "$@"
fi
if [ $# -lt 1 ]; then
    echo "usage: $0 TRAINING_SCRIPT [ARGS...]" >&2
    exit 2
fi
: "${SLURM_JOB_NODELIST:?run this inside a Slurm allocation (sbatch or salloc)}"

read -r -a ddpfix <<< "${DDPFIX:-ddpfix}"
inv=()
if [ -n "${DDPFIX_INVENTORY:-}" ]; then
    inv=(-i "$DDPFIX_INVENTORY")
fi
"${ddpfix[@]}" audit --slurm ${inv[@]+"${inv[@]}"}
"${ddpfix[@]}" env --slurm ${inv[@]+"${inv[@]}"} --apply
exec ${SRUN:-srun} --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    "$(readlink -f "$0")" --on-node "$@"
