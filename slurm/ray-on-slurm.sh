#!/usr/bin/env bash
# ray-on-slurm.sh COMMAND...: verl's multi-node recipe inside one SLURM allocation of N nodes
# (one task per node): Ray's head on the first node, a worker on each other, then COMMAND on
# the head with RAY_ADDRESS set, so verl (ray.init) joins that cluster instead of starting its
# own; Ray is stopped when COMMAND ends, and COMMAND's exit status is the script's.
# Outside an allocation (no SLURM_JOB_ID) COMMAND runs as is: verl starts a one-node Ray.
# The rl rule (workflow/rules/train.smk) runs backend=verl training through it.
# RAY_PYTHON is the interpreter whose Ray starts the nodes (COMMAND's program: the trainer's
# Python); RAY_PORT (6379) and RAY_WAIT_S (the seconds to wait for every node to join, 300) can be set.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }
if [ -z "${SLURM_JOB_ID:-}" ]; then
    exec "$@"
fi

# SLURM's gpu GRES sets ROCR_VISIBLE_DEVICES beside CUDA_VISIBLE_DEVICES in every job step,
# whatever the GPUs' vendor, and verl's workers refuse to start with both set ("Please don't set
# ROCR_VISIBLE_DEVICES when HIP/CUDA_VISIBLE_DEVICES is set"): the Ray nodes and the trainer run
# without it (AMD GPUs would need the reverse; the suite's GPU stack is CUDA's).
unset ROCR_VISIBLE_DEVICES
rocr_unset=(env -u ROCR_VISIBLE_DEVICES)
port=${RAY_PORT:-6379}
py=${RAY_PYTHON:-$1}
ray=("$py" -m ray.scripts.scripts)
# Snakemake's job-step plugin runs a job of several nodes (`mpi`) in the batch script with every
# SLURM_* variable but the job id removed: the nodes come from SLURM itself, and each node's share
# from a step on the head, where SLURM sets it again.
mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(squeue -h -j "$SLURM_JOB_ID" -o %N)}")
head=${nodes[0]}
# The head's address and each node's share of the allocation: GPUs from SLURM's per-node count
# (CUDA_VISIBLE_DEVICES otherwise), CPUs from the allocation's per-node CPUs.
# shellcheck disable=SC2016  # expanded in the step
read -r head_ip gpus cpus < <(srun --overlap --nodes=1 --ntasks=1 -w "$head" sh -c \
    'echo "$(hostname -I | cut -d" " -f1)" "${SLURM_GPUS_ON_NODE:-$(echo "${CUDA_VISIBLE_DEVICES:-}" | tr , "\n" | grep -c .)}" "${SLURM_CPUS_ON_NODE:-1}"')
export RAY_ADDRESS="$head_ip:$port"
echo "ray-on-slurm: ${#nodes[@]} node(s) ${nodes[*]}; head $head ($RAY_ADDRESS); $gpus GPU(s), $cpus CPU(s) per node"

steps=()
stop_ray() {  # each blocking `ray start` stops its own Ray node when its step ends (never
    # `ray stop`: it would end every Ray process on the node, other users' too)
    [ ${#steps[@]} -eq 0 ] || kill "${steps[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap stop_ray EXIT

srun --overlap --nodes=1 --ntasks=1 -w "$head" \
    "${rocr_unset[@]}" "${ray[@]}" start --head --node-ip-address="$head_ip" --port="$port" --num-cpus="$cpus" --num-gpus="$gpus" --block &
steps+=($!)
for node in "${nodes[@]:1}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$node" \
        "${rocr_unset[@]}" "${ray[@]}" start --address="$RAY_ADDRESS" --num-cpus="$cpus" --num-gpus="$gpus" --block &
    steps+=($!)
done

# Every node in before the trainer starts: verl sizes its worker groups from what Ray has.
"$py" - "${#nodes[@]}" "${RAY_WAIT_S:-300}" "${steps[@]}" <<'EOF'
import sys, time
from pathlib import Path
import ray

want, limit, steps = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
deadline = time.monotonic() + limit


def check_steps():
    """A `ray start` that exited (gone, or a zombie not yet reaped) will never join."""
    for pid in steps:
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            sys.exit("ray-on-slurm: a `ray start` step ended before its node joined (its error is above)")


while True:
    try:
        ray.init(address="auto", logging_level="ERROR")
        break
    except ConnectionError:
        check_steps()
        if time.monotonic() > deadline:
            sys.exit(f"ray-on-slurm: no Ray head after {limit:.0f} s")
        time.sleep(1)
while (alive := sum(n["Alive"] for n in ray.nodes())) < want:
    check_steps()
    if time.monotonic() > deadline:
        sys.exit(f"ray-on-slurm: {alive} of {want} Ray nodes joined in {limit:.0f} s")
    time.sleep(1)
print(f"ray-on-slurm: {alive} Ray node(s) up: {ray.cluster_resources()}")
EOF

"$@"
