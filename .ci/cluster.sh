#!/usr/bin/env bash
# A real SLURM of N nodes on this one machine, each node a set of Linux namespaces.
#
#   .ci/cluster.sh start [N]   stop what an earlier run left, then start N nodes (default 3)
#   .ci/cluster.sh stop        kill every node (its jobs, daemons and mounts go with it)
#   .ci/cluster.sh enter NODE CMD...   run CMD inside NODE's namespaces (as root)
#
# Node i is a process tree in its own network (10.77.0.i on bridge stfsbr0, the host side
# is 10.77.0.254), UTS (hostname nodeI), mount and PID namespaces. In its mount namespace
# it has its own /dev/shm (a tmpfs) and its own /tmp (DIR/nodes/nodeI/tmp on the host's
# disk: the node's local disk, $TMPDIR), its own /run and /etc/hosts; everything else is
# the host's file system, so DIR/shared stands for the parallel filesystem and the munge
# socket is shared. slurmctld and munged run on the host (port 6917, not the one-node
# test cluster's 6817). PID 1 of each node reaps orphans; killing it ends the node: the
# kernel kills every process of the PID namespace and the mount namespace goes with them.
#
# DIR is /tmp/stagefs-cluster (STAGEFS_CLUSTER_DIR overrides). `start` writes DIR/env
# (SLURM_CONF, STAGEFS_CLUSTER_NODES) and DIR/run/nodeI.pid (host pid of node I's PID 1).
# Must run as root.
set -euo pipefail

mode=${1:-start}
dir=${STAGEFS_CLUSTER_DIR:-/tmp/stagefs-cluster}
bridge=stfsbr0
net=10.77.0
port_ctld=6917
port_slurmd=6918

log() { echo "cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=.ci/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"

# Host pid of a node's PID 1, if it still runs.
node_pid() {
    local f=$dir/run/$1.pid pid
    [[ -s $f ]] || return 1
    pid=$(<"$f")
    [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' </proc/"$pid"/cmdline | grep -q "stagefs-cluster-node $1 " || return 1
    echo "$pid"
}

enter() {  # enter NODE CMD...
    local node=$1 pid; shift
    pid=$(node_pid "$node") || die "$node is not running"
    exec nsenter -t "$pid" -n -u -m -p -- "$@"
}

stop() {
    local f node pid
    for f in "$dir"/run/node*.pid; do
        [[ -e $f ]] || continue
        node=$(basename "$f" .pid)
        if pid=$(node_pid "$node"); then
            # PID 1 of the node: SIGKILL takes the whole namespace down.
            kill -9 "$pid" 2>/dev/null || true
            for _ in $(seq 100); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
        fi
        rm -f "$f"
    done
    stop_daemon "$dir/run/slurmctld.pid" slurmctld
    stop_daemon "$dir/run/munged.pid" munged
    ip link del "$bridge" 2>/dev/null || true
    for f in /sys/class/net/vsf*; do
        if [[ -e $f ]]; then ip link del "$(basename "$f")" 2>/dev/null || true; fi
    done
    log "stopped ($dir)"
}

write_config() {
    local n=$1 i
    mkdir -p "$dir"/{run,log,state,spool,munge,shared}
    chmod 0755 "$dir/munge"
    chmod 1777 "$dir/shared"
    if [[ ! -s $dir/munge.key ]]; then
        head -c 1024 /dev/urandom >"$dir/munge.key"
        chmod 0400 "$dir/munge.key"
    fi
    {
        echo "127.0.0.1 localhost"
        echo "$net.254 $(hostname -s)"
        for i in $(seq "$n"); do echo "$net.$i node$i"; done
    } >"$dir/hosts"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=stagefs-multi
SlurmctldHost=$(hostname -s)($net.254)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPort=$port_ctld
SlurmdPort=$port_slurmd
TmpFS=/tmp
KillWait=5
MinJobAge=300
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
NodeName=node[1-$n] NodeAddr=$net.[1-$n] CPUs=8 State=UNKNOWN
PartitionName=multi Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP
CONF
    printf 'export SLURM_CONF=%q\nexport STAGEFS_CLUSTER_DIR=%q\nexport STAGEFS_CLUSTER_NODES=%q\n' \
        "$dir/slurm.conf" "$dir" "$n" >"$dir/env"
}

# PID 1 of a node: reaps every orphan (daemonized slurmd, detached stagefs daemons), so
# that no zombie looks like a live process to the jobs or to the leftover checks.
REAPER='import os, sys, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)'

start_node() {
    local i=$1 node=node$1 upid pid
    mkdir -p "$dir/nodes/$node/tmp" "$dir/spool/$node"
    chmod 1777 "$dir/nodes/$node/tmp"
    # Inside: a private /dev/shm and /run (tmpfs), /tmp = this node's local disk, with DIR
    # moved back into it (DIR lives in the host's /tmp, hidden by the bind otherwise).
    # The last argument names the node in PID 1's command line (found by node_pid).
    # shellcheck disable=SC2016  # the script expands its own arguments
    unshare --net --uts --mount --pid --fork --mount-proc --propagation private -- bash -c '
        set -e
        dir=$1 node=$2
        hostname "$node"
        # The new namespace starts with a copy of the host'"'"'s mounts: FUSE mounts of the
        # host (other tests'"'"') must not be the node'"'"'s, nor anything under its /dev/shm.
        awk '"'"'{for (i = 7; i < NF; i++) if ($i == "-") { if ($(i + 1) ~ /^fuse/) print $5; break }}'"'"' \
            /proc/self/mountinfo | sort -r | while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
        while umount -l /dev/shm 2>/dev/null; do :; done  # the host may stack several
        mount -t tmpfs -o mode=1777,size=8g "shm-$node" /dev/shm
        mount -t tmpfs -o mode=0755 "run-$node" /run
        mkdir /dev/shm/.cluster
        mount --rbind "$dir" /dev/shm/.cluster
        mount --bind "$dir/nodes/$node/tmp" /tmp
        mkdir -p /tmp/stagefs-cluster
        mount --move /dev/shm/.cluster /tmp/stagefs-cluster
        rmdir /dev/shm/.cluster
        mount --bind "$dir/hosts" /etc/hosts
        exec /usr/bin/python3 -c "$3" stagefs-cluster-node "$node"
    ' bash "$dir" "$node" "$REAPER" </dev/null 9>&- >>"$dir/log/$node.holder.log" 2>&1 &
    upid=$!
    for _ in $(seq 100); do
        pid=$(awk '{print $1}' /proc/"$upid"/task/"$upid"/children 2>/dev/null) || true
        [[ -n $pid ]] && tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | grep -q "stagefs-cluster-node $node " && break
        sleep 0.1
    done
    [[ -n $pid ]] || die "$node did not start (log: $dir/log/$node.holder.log)"
    echo "$pid" >"$dir/run/$node.pid"
    ip link add "vsf$i" type veth peer name eth0 netns "$pid"
    ip link set "vsf$i" master "$bridge" up
    nsenter -t "$pid" -n -- sh -c "ip link set lo up && ip addr add $net.$i/24 dev eth0 && ip link set eth0 up"
}

node_states() { sinfo -h -N -o '%N %t' 2>/dev/null; }

start() {
    local n=$1 i pid
    [[ $(id -u) == 0 ]] || die "must run as root"
    [[ $n -ge 1 && $n -le 200 ]] || die "N must be 1..200"
    for tool in slurmctld slurmd sbatch munged unshare nsenter ip python3; do
        command -v "$tool" >/dev/null || die "$tool is missing (apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux)"
    done
    mkdir -p "$dir"
    # The daemons started below must not inherit fd 9, or they would hold the lock.
    exec 9>"$dir/setup.lock"
    flock -w 120 9 || die "another start holds $dir/setup.lock"

    stop
    # A fresh cluster: jobs recovered from old state would hold nodes.
    rm -rf "${dir:?}/state" "${dir:?}/spool" "${dir:?}/nodes" "${dir:?}/log"
    write_config "$n"
    export SLURM_CONF=$dir/slurm.conf
    munged --key-file="$dir/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" 9>&-
    ip link add "$bridge" type bridge
    ip addr add "$net.254/24" dev "$bridge"
    ip link set "$bridge" up
    slurmctld -f "$SLURM_CONF" 9>&-
    for _ in $(seq 300); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
    scontrol ping | grep -q UP || die "slurmctld is not answering (log: $dir/log/slurmctld.log)"
    for i in $(seq "$n"); do
        start_node "$i"
        pid=$(<"$dir/run/node$i.pid")
        # slurmd reads SLURM_CONF; started in the node's namespaces, it and every job step
        # see the node's hostname, address, /dev/shm, /tmp and processes.
        nsenter -t "$pid" -n -u -m -p -- env SLURM_CONF="$SLURM_CONF" slurmd -f "$SLURM_CONF" -N "node$i" 9>&-
    done
    for _ in $(seq 600); do
        [[ $(node_states | grep -c ' idle$') == "$n" ]] && break
        node_states | awk '$2 ~ /^(down|drain)/ {print $1}' | while read -r bad; do
            scontrol update NodeName="$bad" State=RESUME 2>/dev/null || true
        done
        sleep 0.1
    done
    [[ $(node_states | grep -c ' idle$') == "$n" ]] \
        || die "not all $n nodes idle after 60s: $(node_states | tr '\n' ' ') (logs: $dir/log)"
    log "SLURM is up: $n nodes idle; source $dir/env"
}

case $mode in
    start) start "${2:-3}" ;;
    stop) stop ;;
    enter) shift; enter "$@" ;;
    *) die "usage: $0 start [N] | stop | enter NODE CMD..." ;;
esac
