#!/usr/bin/env bash
# The structure figures doc/design.md reports (issue 40): lines per crate, the archive
# crate's public names and how many no other crate uses, `Result<_, String>` in public
# signatures, and test lines. Text only, but for the test count (it builds the integration tests).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

product_lines() { # .rs files under $1, unit-test files left out
    find "$1" -name '*.rs' ! -name 'tests.rs' ! -name '*_tests.rs' ! -name 'test_*.rs' -print0 | xargs -0 cat | wc -l
}
echo "lines: src/ $(product_lines src), crates/stagefs-open $(product_lines crates/stagefs-open/src)," \
    "crates/stagefs-archive $(product_lines crates/stagefs-archive/src)"

archive=crates/stagefs-archive/src
outside=(src crates/stagefs-open crates/stagefs-reader crates/stagefs-remote python/native fuzz tests)
names=$(grep -rhoE '^\s*pub (fn|struct|enum|trait|type|const|static|mod|use) [A-Za-z_][A-Za-z0-9_]*' "$archive" |
    awk '{print $3}' | sort -u)
unused=0
for name in $names; do
    grep -rqw --include='*.rs' "$name" "${outside[@]}" || unused=$((unused + 1))
done
echo "archive crate: $(echo "$names" | wc -l) public names, $unused used by no other crate"

echo "pub fns returning Result<_, String>: $(grep -rE --include='*.rs' '^\s*pub fn[^{;]*Result<[^{;]*, String>' src crates python/native | wc -l)"
echo "Result<_, String> anywhere (product and tests): $(grep -rE --include='*.rs' 'Result<[^;{]*, String>' src crates python/native | wc -l)"

tests=$(find tests -name '*.rs' -print0 | xargs -0 cat | wc -l)
kits=$(find crates -name 'test_kit.rs' -o -name 'test_support.rs' -o -name 'test_rng.rs' | xargs cat 2>/dev/null | wc -l)
units=$(find src crates -name 'tests.rs' -o -name '*_tests.rs' | xargs cat | wc -l)
# Tests are counted as the harness lists them: `cases!` makes several `#[test]`s from one.
listed=$(cargo test -q --test integration -- --list 2>/dev/null | grep -c ': test$')
echo "test lines: tests/ (with its kit) $tests, the archive crate's test kit $kits, unit-test files $units;" \
    "tests in tests/ $listed"
