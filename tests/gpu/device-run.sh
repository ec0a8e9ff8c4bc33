#!/usr/bin/env bash
# Every GPU check and benchmark, on a machine with an NVIDIA GPU, python3 with torch and
# torchvision, and nothing to build with: the artifacts come ready-made in one folder.
#
#   tests/gpu/device-run.sh ARTIFACTS [OUTDIR]
#
# ARTIFACTS holds what tests/gpu/build-artifacts.sh makes on a build machine: the stagefs
# wheel, the release `stagefs-reader` binary and the reader's GPU test binary. Runs:
#   1. the reader's GPU tests (crates/stagefs-reader/tests/gpu.rs),
#   2. the Python suite with the real torch, the `gpu`-marked tests included,
#   3. benches/gpu_loader.py and examples/jpeg_pipeline.py on generated trees,
# and copies the reports into OUTDIR (default: the current directory).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ART=$(cd "$1" && pwd)
OUTDIR=${2:-$PWD}
mkdir -p "$OUTDIR"
status=0
step() { echo; echo "=== $*"; }

step machine
nvidia-smi -L; python3 -V; ldd --version | sed -n 1p; nproc
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, torch.cuda.get_device_name(0))'
ls -l /dev/fuse 2>&1; command -v fusermount3 || echo "no fusermount3"

step install the wheel into the environment that has torch
# (that python3 may itself be a venv, whose packages a new venv would not see)
python3 -m pip install -q --no-index --no-deps --force-reinstall "$ART"/stagefs-*.whl || exit 1
export PATH=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH
stagefs --version

step reader GPU tests
"$ART/reader-gpu-tests" --test-threads=1 || status=1

step Python tests with torch, gpu-marked included
(cd tests/python && python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" . ) 2>&1 | tee "$OUTDIR/pytest.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

step benchmark trees
tree=/dev/shm/sfs-bench/tree
"$ART/stagefs-reader" gen "$tree" --files 20000 --min-bytes 20K --max-bytes 200K --seed 1 >/dev/null
tar -cf /dev/shm/sfs-bench/tree.tar -C "$tree" .
python3 tests/gpu/make_jpeg_tree.py /dev/shm/sfs-bench/jpeg 100 60
tar -cf /dev/shm/sfs-bench/jpeg.tar -C /dev/shm/sfs-bench/jpeg .
du -sh /dev/shm/sfs-bench/*

# Served from a stagefs mount staged in RAM when FUSE works here, else from tmpfs.
src=$tree jpeg=/dev/shm/sfs-bench/jpeg.tar
if stagefs mount --stage ram /dev/shm/sfs-bench/tree.tar /dev/shm/sfs-bench/mnt; then
    src=/dev/shm/sfs-bench/mnt
else
    echo "FUSE is not usable here: the benchmarks read the tmpfs tree"; jpeg=/dev/shm/sfs-bench/jpeg
fi

step "files into GPU memory: Loader(cuda) vs stagefs-reader bench vs DataLoader(16 workers, pin_memory)"
python3 benches/gpu_loader.py "$src" --workers 16 --epochs 2 --reader-bin "$ART/stagefs-reader" 2>&1 | tee "$OUTDIR/gpu_loader.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

step "JPEG: Loader(cpu) + decode_jpeg(cuda) vs ImageFolder + DataLoader(16 workers, PIL)"
python3 examples/jpeg_pipeline.py "$jpeg" --workers 16 2>&1 | tee "$OUTDIR/jpeg_pipeline.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

[[ $src == /dev/shm/sfs-bench/mnt ]] && stagefs umount /dev/shm/sfs-bench/mnt
rm -rf /dev/shm/sfs-bench
exit $status
