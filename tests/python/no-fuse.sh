#!/usr/bin/env bash
# Runs pytest as an ordinary user in a mount namespace where /dev/fuse does not exist: a
# container, a Kubernetes pod, a cluster that disables FUSE. stagefs.open must work there.
#
#   tests/python/no-fuse.sh PYTHON [pytest args...]     (as root; run.sh calls it)
#
# The namespace gets a /dev of its own (a small tmpfs holding null, zero, full, random,
# urandom, tty, shm, pts and the fd links, bound from the real /dev) with no fuse node;
# the host's /dev is untouched. Then setpriv drops to the user STAGEFS_TEST_NOFUSE_USER
# (default stagefs-nofuse, created if missing) with a login-like environment, and
# STAGEFS_TEST_NO_FUSE=1 tells the tests where they run. Needs util-linux (unshare, mount,
# setpriv) and passwd (useradd).
set -euo pipefail
python=${1:?usage: no-fuse.sh PYTHON [pytest args...]}
shift
if [[ $(id -u) -ne 0 ]]; then
    echo "no-fuse.sh: must run as root (it makes a mount namespace and drops to a user)" >&2
    exit 1
fi
user=${STAGEFS_TEST_NOFUSE_USER:-stagefs-nofuse}
id "$user" >/dev/null 2>&1 || useradd --create-home --user-group --shell /bin/sh "$user"
uid=$(id -u "$user")
gid=$(id -g "$user")
home=$(getent passwd "$user" | cut -d: -f6)
if ! setpriv --reuid="$uid" --regid="$gid" --init-groups -- env "$python" -c '' 2>/dev/null; then
    echo "no-fuse.sh: $user cannot run $python (an interpreter under /root?); make the venv from one every user can run" >&2
    exit 1
fi

# shellcheck disable=SC2016 # expanded by the inner shell
exec unshare --mount --propagation private -- bash -c '
    set -euo pipefail
    uid=$1 gid=$2 user=$3 home=$4
    shift 4
    dev=$(mktemp -d /tmp/stagefs-nofuse-dev.XXXXXX)
    mount -t tmpfs -o mode=0755,size=1m stagefs-nofuse "$dev"
    for node in null zero full random urandom tty; do
        if [[ -e /dev/$node ]]; then
            touch "$dev/$node"
            mount --bind "/dev/$node" "$dev/$node"
        fi
    done
    for dir in shm pts mqueue; do
        if [[ -d /dev/$dir ]]; then
            mkdir "$dev/$dir"
            mount --rbind "/dev/$dir" "$dev/$dir"
        fi
    done
    ln -s /proc/self/fd "$dev/fd"
    ln -s fd/0 "$dev/stdin"
    ln -s fd/1 "$dev/stdout"
    ln -s fd/2 "$dev/stderr"
    mount --move "$dev" /dev
    rmdir "$dev"
    if [[ -e /dev/fuse ]]; then
        echo "no-fuse.sh: /dev/fuse is still there" >&2
        exit 1
    fi
    exec setpriv --reuid="$uid" --regid="$gid" --init-groups --reset-env -- \
        env HOME="$home" USER="$user" PATH=/usr/local/bin:/usr/bin:/bin STAGEFS_TEST_NO_FUSE=1 "$@"
' no-fuse "$uid" "$gid" "$user" "$home" "$python" -m pytest "$@"
