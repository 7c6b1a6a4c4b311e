#!/usr/bin/env bash
# A real SLURM cluster on this (Debian) machine, for the tests and CI:
#   slurm/local-cluster.sh up     install (apt) if needed, then start munge, MariaDB, slurmdbd,
#                                 slurmctld and two slurmd by hand (no systemd), with accounting
#                                 and 8 fake GPUs as GRES per node; prints the seconds it took
#   slurm/local-cluster.sh down   stop what `up` started, by PID, newest first
# Run as root. The node declares more CPUs and memory than the machine has
# (SlurmdParameters=config_overrides) so the paper's 8x8-CPU, 512 GB jobs schedule; the jobs
# themselves are the tiny presets'. Two nodes on this one host (one slurmd each, on its own
# port): $HOST and $HOST-2. Partitions: `gpu` (the profile's) and `urgent`, whose jobs preempt
# (cancel) `gpu` jobs, both on $HOST alone (the fault tests use them); `pair`, both nodes, for
# jobs of several nodes. Account `cbpo`, root's default.
set -euo pipefail

STATE=${CBPO_SLURM_STATE:-/var/lib/cbpo-slurm}
CLUSTER=cbpo
HOST=$(hostname -s)
NODES=("$HOST" "$HOST-2")
PIDS=(/run/munge/munged.pid /run/mysqld/mysqld.pid "$STATE/slurmdbd.pid" "$STATE/slurmctld.pid"
      "$STATE/slurmd.$HOST.pid" "$STATE/slurmd.$HOST-2.pid")

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2
    shift 2
    for _ in $(seq $((limit * 4))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    echo "local-cluster: $what did not come up in ${limit}s (logs: $STATE/log)" >&2
    return 1
}

install() {
    command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        munge slurmctld slurmd slurm-client slurmdbd mariadb-server >/dev/null
}

write_configs() {
    mkdir -p "$STATE"/{log,state,dev} /etc/slurm "${NODES[@]/#/$STATE/spool/}"
    for i in $(seq 0 7); do  # character devices: slurmd then sets CUDA_VISIBLE_DEVICES per job
        [ -e "$STATE/dev/nvidia$i" ] || mknod "$STATE/dev/nvidia$i" c 195 "$i"
    done
    cat > /etc/slurm/slurm.conf <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
# Finished jobs stay in squeue 300 s (the plugin's squeue status needs >= 3x its first delay).
MinJobAge=300
# A job without --mem gets this much per CPU, not the whole node.
DefMemPerCPU=1024
KillWait=5
# Memory is enforced by polling (no cgroups here): a step over its --mem ends OUT_OF_MEMORY.
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
# Comment: the plugin names each job's rule there; the tests read it back from sacct.
AccountingStoreFlags=job_comment
AccountingStorageEnforce=associations
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
GresTypes=gpu
NodeName=$HOST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=6818 CPUs=128 RealMemory=1100000 Gres=gpu:8 State=UNKNOWN
NodeName=$HOST-2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=6828 CPUs=128 RealMemory=1100000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=$HOST MaxTime=INFINITE State=UP PriorityTier=2
PartitionName=pair Nodes=$HOST,$HOST-2 MaxTime=INFINITE State=UP PriorityTier=1
EOF
    cat > /etc/slurm/gres.conf <<EOF
AutoDetect=off
Name=gpu File=$STATE/dev/nvidia[0-7]
EOF
    cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=cbpo-local
EOF
    chmod 600 /etc/slurm/slurmdbd.conf  # slurmdbd refuses a readable one
}

up() {
    if sinfo -h >/dev/null 2>&1; then
        echo "local-cluster: already up"
        return
    fi
    local t0=$SECONDS
    install
    local installed=$SECONDS
    write_configs
    mkdir -p /run/munge /run/mysqld
    chown munge:munge /run/munge
    chown mysql:mysql /run/mysqld
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
    runuser -u munge -- /usr/sbin/munged
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    # Local socket only: nothing listens on the network.
    mariadbd --user=mysql --skip-networking --pid-file=/run/mysqld/mysqld.pid >"$STATE/log/mariadb.log" 2>&1 &
    wait_for 60 MariaDB mariadb -e "SELECT 1"
    mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'cbpo-local';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    slurmdbd
    wait_for 60 slurmdbd sacctmgr -n show cluster
    sacctmgr -n show cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
    sacctmgr -n show account format=account | grep -qw cbpo || sacctmgr -i add account cbpo >/dev/null
    # root exists already (with account root): give it cbpo too, as its default
    sacctmgr -n show assoc where user=root account=cbpo format=account | grep -qw cbpo \
        || sacctmgr -i add user root account=cbpo >/dev/null
    sacctmgr -i modify user where name=root set DefaultAccount=cbpo >/dev/null 2>&1 || true
    slurmctld
    for node in "${NODES[@]}"; do slurmd -N "$node"; done
    wait_for 60 "the nodes" sh -c '[ "$(sinfo -h -N -p pair -o %T | grep -cE "^(idle|mixed|allocated)")" = 2 ]'
    echo "local-cluster: up in $((SECONDS - t0)) s (install $((installed - t0)) s); state in $STATE"
}

down() {
    local i pid
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        [ -s "${PIDS[i]}" ] || continue
        pid=$(cat "${PIDS[i]}")
        if kill "$pid" 2>/dev/null; then
            for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
        rm -f "${PIDS[i]}"
    done
    echo "local-cluster: down"
}

case ${1:-} in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
