#!/usr/bin/env bash
# One node's share of a multi-node run: `accelerate launch` with this node's rank.
#
#   MACHINE_RANK=0 bash recipes/slurm/launch_node.sh -m align train RECIPE.yaml [key=value ...]
#
# train_multinode.sbatch runs it once per srun task, one task per node (MACHINE_RANK=
# $SLURM_PROCID); tests/distributed/test_qrpo_distributed.py runs it twice on one machine,
# as two "machines" of one process each meeting on 127.0.0.1, and tests/slurm submits
# train_multinode.sbatch as two tasks on one node, so the arguments built here are the
# ones a cluster run gets.
#
# Environment (all required but ACCELERATE_LAUNCH):
#   ACCELERATE_CONFIG   accelerate config (recipes/accelerate/zero2.yaml, zero3.yaml)
#   NNODES              number of machines
#   NUM_PROCESSES       ranks over all machines (NNODES x GPUs per node)
#   MACHINE_RANK        this machine's rank, 0 .. NNODES-1 (0 hosts the rendezvous)
#   MAIN_PROCESS_IP     address of machine 0
#   MAIN_PROCESS_PORT   rendezvous port on machine 0
#   ACCELERATE_LAUNCH   the launcher command (default: accelerate launch)
# Arguments: what every rank runs: `-m align STAGE RECIPE ...`, or SCRIPT ARGS...
set -euo pipefail

read -r -a launcher <<< "${ACCELERATE_LAUNCH:-accelerate launch}"
exec "${launcher[@]}" \
  --config_file "${ACCELERATE_CONFIG:?}" \
  --num_machines "${NNODES:?}" \
  --num_processes "${NUM_PROCESSES:?}" \
  --machine_rank "${MACHINE_RANK:?}" \
  --main_process_ip "${MAIN_PROCESS_IP:?}" \
  --main_process_port "${MAIN_PROCESS_PORT:?}" \
  --rdzv_backend static \
  --same_network \
  "$@"
