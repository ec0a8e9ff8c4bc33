# shellcheck shell=bash
# Shared by .ci/slurm-setup.sh and .ci/cluster.sh (sourced, not run).

# Kills the daemon whose pid file is $1, only if that pid still runs the expected program
# $2 (a stale file may name a reused pid), then removes the file.
stop_daemon() {
    local pidfile=$1 name=$2 pid
    [[ -s $pidfile ]] || return 0
    pid=$(<"$pidfile")
    if [[ -r /proc/$pid/comm && $(</proc/"$pid"/comm) == "$name"* ]]; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
        if [[ -e /proc/$pid ]]; then kill -9 "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$pidfile"
}
