#!/usr/bin/env bash
# Checks a stagefs wheel before it is shipped:
#   - it contains the native `stagefs` executable as a script (an ELF file, not a shim);
#   - `auditwheel show` finds it consistent with a manylinux tag, and the file name carries one;
#   - every ELF file in it (the extension module AND the binary, which maturin does not audit)
#     needs no GLIBC symbol version above 2.17 (checked with both objdump -T and readelf -V),
#     and links no libcuda (CUDA is loaded at run time with dlopen).
# Usage: python/check-wheel.sh WHEEL   (exit 1 on any failure)
set -euo pipefail
wheel=${1:?usage: check-wheel.sh WHEEL}
MAX=2.17
fail() { echo "check-wheel: FAIL: $*" >&2; exit 1; }

name=$(basename "$wheel")
case "$name" in
    *manylinux2014_x86_64*|*manylinux_2_17_x86_64*) ;;
    *) fail "$name: not tagged manylinux2014 / manylinux_2_17" ;;
esac

if command -v auditwheel >/dev/null; then
    report=$(auditwheel show "$wheel" 2>&1) || fail "auditwheel show failed: $report"
    echo "$report" | tr -s ' \n' ' ' | fold -s -w 100
    echo
    echo "$report" | tr -s ' \n' ' ' | grep -Eq 'consistent with the following platform tag: "manylinux(_2_17|2014)_x86_64"' \
        || fail "auditwheel does not find the wheel consistent with manylinux_2_17"
else
    fail "auditwheel not on PATH (python/build-wheel.sh installs it into its venv)"
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$dir"

script=$(find "$dir" -path '*/stagefs-*.data/scripts/stagefs' -type f)
[ -n "$script" ] || fail "no stagefs-*.data/scripts/stagefs in the wheel: the native command is missing"
[ "$(head -c 4 "$script" | od -An -c | tr -d ' ')" = '177ELF' ] || fail "the stagefs script is not an ELF binary"

version_gt() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n1)" = "$1" ] && [ "$1" != "$2" ]; }
highest=0
elves=0
while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    elves=$((elves + 1))
    rel=${f#"$dir"/}
    by_objdump=$(objdump -T "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
    by_readelf=$(readelf -V -W "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
    for v in $by_objdump $by_readelf; do
        version_gt "$v" "$MAX" && fail "$rel needs GLIBC_$v (> $MAX)"
        version_gt "$v" "$highest" && highest=$v
    done
    if readelf -d "$f" | grep -q 'NEEDED.*libcuda'; then
        fail "$rel links libcuda; it must be loaded at run time"
    fi
    printf 'check-wheel: %-60s highest GLIBC_%s (objdump) / GLIBC_%s (readelf)\n' "$rel" "$by_objdump" "$by_readelf"
done < <(find "$dir" -type f -print0)
[ "$elves" -ge 2 ] || fail "expected at least 2 ELF files (extension module and binary), found $elves"
echo "check-wheel: OK: $name, $elves ELF files, highest GLIBC version needed: $highest (limit $MAX)"
