#!/usr/bin/env bash
# The project's one test command (the README's, and what .ci/run calls): the Rust tests of
# the whole workspace (unit and real-mount integration tests, as root with /dev/fuse), then
# the Python package's tests against a freshly built wheel in a fresh venv.
#
#   tests/run.sh
#
# .ci/run installs every tool both need on a fresh Debian machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --no-fail-fast: one failing crate must not hide the failures of the others.
cargo test --workspace --no-fail-fast
# Through bash, not the run bit: a lost bit must not skip the Python suite silently.
bash tests/python/run.sh
