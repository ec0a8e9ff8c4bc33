#!/usr/bin/env bash
# Two builds of the Loader side by side on one GPU machine, on the same data, alternated:
#
#   tests/gpu/compare-wheels.sh ARTIFACTS OLD_WHEEL_DIR NEW_WHEEL_DIR [ROUNDS]
#
# ARTIFACTS is what tests/gpu/build-artifacts.sh made (the `stagefs-reader` binary is the
# bench both are compared with); each wheel dir holds one stagefs wheel (build an older one
# with python/build-wheel.sh in a worktree of that commit). Each round installs a wheel,
# mounts the tree with that wheel's `stagefs`, and runs benches/gpu_loader.py: a GPU
# figure that moved is told from a machine that differs only this way.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
art=$(cd "$1" && pwd) old=$(cd "$2" && pwd) new=$(cd "$3" && pwd) rounds=${4:-2}
scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH=$scripts:$PATH
work=/dev/shm/sfs-compare
trap 'stagefs umount "$work/mnt" 2>/dev/null; rm -rf "$work"' EXIT
"$art/stagefs-reader" gen "$work/tree" --files 20000 --min-bytes 20K --max-bytes 200K --seed 1 >/dev/null
tar -cf "$work/tree.tar" -C "$work/tree" . && rm -rf "$work/tree"
for round in $(seq "$rounds"); do
    for build in old new; do
        [[ $build == old ]] && wheels=$old || wheels=$new
        python3 -m pip install -q --no-index --no-deps --force-reinstall "$wheels"/stagefs-*.whl || exit 1
        stagefs mount --stage ram "$work/tree.tar" "$work/mnt" || exit 1
        echo "== $build, round $round"
        python3 benches/gpu_loader.py "$work/mnt" --workers 16 --epochs 2 --reader-bin "$art/stagefs-reader" |
            grep -E '^\((a|b|c)\)|^pinned'
        stagefs umount "$work/mnt"
    done
done
