#!/usr/bin/env bash
# One task of a training step, on each node of a Slurm job: srun starts it as the job's user (no root, no SSH).
#
#   srun --kill-on-bad-exit=1 examples/slurm/ddp-step.sh train.py [ARGS...]    # examples/slurm/train.sbatch does it
#
#   1. the node's own env file, if any (written once by the operator with `ddpfix env --apply`, ddp_env_scope: node:
#      socket interfaces, fabric variables; nothing of any job);
#   2. this job's values, derived here and now from the step's SLURM_* variables by `ddpfix env --slurm --export`:
#      MASTER_ADDR (the step's first node, at its cluster address from /etc/ddpfix/cluster.json), MASTER_PORT (from
#      SLURM_JOB_ID inside the site's port range, outside the ephemeral range), NNODES, NODE_RANK (SLURM_NODEID),
#      NPROC_PER_NODE and torchrun's PET_* names; nothing is written, so two jobs on a node never share a file;
#   3. a bare torchrun, which reads PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT.
#
# A bad or inconsistent SLURM_* variable stops the task with one line naming it (exit 2), never a wrong rank.
# Environment: DDPFIX (the ddpfix command; default ddpfix), DDPFIX_ENV_FILE (default /etc/ddpfix/ddp.env),
# TORCHRUN (default torchrun), and ddpfix's own DDPFIX_HET_GROUP, DDPFIX_PORT_RANGE, DDPFIX_NPROC_PER_NODE.
set -euo pipefail

env_file=${DDPFIX_ENV_FILE:-/etc/ddpfix/ddp.env}
if [ -r "$env_file" ]; then
    set -a
    . "$env_file"
    set +a
fi
read -r -a ddpfix <<< "${DDPFIX:-ddpfix}"
values=$("${ddpfix[@]}" env --slurm --export)  # after the file: this job's values win over any it still holds
eval "$values"
exec ${TORCHRUN:-torchrun} --max-restarts=0 "$@"
