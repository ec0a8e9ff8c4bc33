#!/usr/bin/env bash
# A real one-node SLURM on loopback for the tests: no systemd, everything under one dir.
#
#   .ci/slurm-setup.sh start [DIR]   install if needed, start munged/slurmctld/slurmd, wait idle
#   .ci/slurm-setup.sh stop  [DIR]   kill the daemons started from DIR, by their pid files
#
# DIR defaults to /tmp/stagefs-slurm. `start` writes DIR/env (export SLURM_CONF=...) for
# the tests to source, and is a no-op if that cluster already answers. Must run as root.
set -euo pipefail

mode=${1:-start}
dir=${2:-/tmp/stagefs-slurm}
node=$(hostname -s)

log() { echo "slurm-setup: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=.ci/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null && return 0
    log "installing slurmctld slurmd slurm-client munge"
    # Keep the packages from starting services with their stock configuration.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
    rm -f /usr/sbin/policy-rc.d
    trap - EXIT
}

# Kills what the cluster of DIR left running: job steps outlive a killed slurmd, and
# recovered by a new slurmd they would hold the node allocated. They are found by the
# SLURM_CONF they inherited (slurmd was started with it exported).
stop_job_processes() {
    local env pid pids=()
    for env in /proc/[0-9]*/environ; do
        pid=${env#/proc/}; pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        if tr '\0' '\n' 2>/dev/null <"$env" | grep -qxF "SLURM_CONF=$dir/slurm.conf"; then
            pids+=("$pid")
        fi
    done
    (( ${#pids[@]} )) || return 0
    log "killing ${#pids[@]} leftover job processes"
    kill "${pids[@]}" 2>/dev/null || true
    sleep 1
    kill -9 "${pids[@]}" 2>/dev/null || true
}

stop() {
    stop_daemon "$dir/run/slurmd.pid" slurmd
    stop_daemon "$dir/run/slurmctld.pid" slurmctld
    stop_daemon "$dir/run/munged.pid" munged
    stop_job_processes
    log "stopped the daemons of $dir"
}

write_config() {
    mkdir -p "$dir"/{run,log,state,spool,munge}
    chmod 0755 "$dir/munge"  # munged refuses a socket directory of mode 0700
    if [[ ! -s $dir/munge.key ]]; then
        head -c 1024 /dev/urandom >"$dir/munge.key"
        chmod 0400 "$dir/munge.key"
    fi
    cat >"$dir/slurm.conf" <<CONF
ClusterName=stagefs
SlurmctldHost=$node(127.0.0.1)
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
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
KillWait=5
MinJobAge=300
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
NodeName=$node NodeAddr=127.0.0.1 CPUs=32 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
    printf 'export SLURM_CONF=%q\nexport STAGEFS_SLURM_DIR=%q\nexport STAGEFS_SLURM_NODE=%q\n' \
        "$dir/slurm.conf" "$dir" "$node" >"$dir/env"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    for _ in $(seq $((limit * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "$what did not happen within ${limit}s (logs: $dir/log)"
}

node_idle() { [[ $(sinfo -h -n "$node" -o %t 2>/dev/null) == idle ]]; }
# Answering, possibly busy with someone's jobs: a running cluster that must not be restarted
# (a restart kills every job process, and with them whoever else is testing on this node).
node_up() { [[ $(sinfo -h -n "$node" -o %t 2>/dev/null) =~ ^(idle|mix|alloc|comp) ]]; }

start() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    # Two tests may start the same cluster at once: one installs and starts, the other
    # waits here and then finds it running (apt-get would refuse a second install anyway).
    mkdir -p "$dir"
    exec 9>"$dir/setup.lock"
    flock -w 300 9 || die "another start holds $dir/setup.lock for over 5 minutes (a daemon that inherited it? fuser -v $dir/setup.lock)"
    if [[ -s $dir/env ]] && SLURM_CONF=$dir/slurm.conf node_up; then
        log "already running ($dir)"; return 0
    fi
    install_packages
    stop  # leftovers from an earlier run of this dir
    # A fresh cluster: jobs recovered from an old state dir (say, a machine image taken
    # while tests ran) would hold the node allocated and never finish.
    rm -rf "${dir:?}/state" "${dir:?}/spool"
    write_config
    export SLURM_CONF=$dir/slurm.conf
    # The daemons must not inherit the lock (fd 9): one that held it would block every later
    # start, for as long as the cluster runs.
    munged --key-file="$dir/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" 9>&-
    wait_for 10 "munge round trip" bash -c "munge -S '$dir/munge/munge.socket' -n | unmunge -S '$dir/munge/munge.socket'"
    slurmctld -f "$SLURM_CONF" 9>&-
    wait_for 30 "slurmctld answering" bash -c "scontrol ping | grep -q UP"
    slurmd -f "$SLURM_CONF" -N "$node" 9>&-
    for _ in $(seq 300); do
        node_idle && break
        case $(sinfo -h -n "$node" -o %t 2>/dev/null) in
            down*|drain*) scontrol update NodeName="$node" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 0.1
    done
    node_idle || die "node $node is not idle after 30s: $(sinfo -h -n "$node" -o '%t %E' 2>&1) (logs: $dir/log)"
    log "SLURM is up: node $node idle; source $dir/env"
}

case $mode in
    start) start ;;
    stop) stop ;;
    *) die "usage: $0 start|stop [DIR]" ;;
esac
