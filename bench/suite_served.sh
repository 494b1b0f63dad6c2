#!/usr/bin/env bash
# A library's own test suite on Triton's JIT and served from kforge bundles, side by side, on one GPU machine:
#   bash bench/suite_served.sh TEST_ROOT BUNDLES OUT_DIR WORKERS PYTEST_ARGS...
# TEST_ROOT: where pytest runs (a clone of the library's repository; the installed library is what is tested).
# BUNDLES: out/dist of a project that built the suite's record (pytest --kforge-record specs/tests.jsonl, then
# doit and doit package). PYTEST_ARGS: the test files and any -k. Each run in a fresh Triton cache, except the
# warm JIT's (the cold one's cache). Writes OUT_DIR/{jit_cold,jit_warm,served,one_process,verify}.xml and .log;
# then compares each served run with the cold JIT's, test by test (bench/compare_junit.py).
# liger-kernel 0.8.5 (docs/benchmarks.md, "A real test suite, served"):
#   bash bench/suite_served.sh liger-kernel dist out 16 test/transformers/test_{rms_norm,layer_norm,softmax}.py
# fla-core 0.5.2, its repository at tag v0.5.2:
#   bash bench/suite_served.sh flash-linear-attention dist out 16 tests/modules/test_l2norm.py \
#       tests/modules/test_layernorm_gated.py tests/ops/test_solve_tril.py tests/ops/utils/test_pooling.py \
#       tests/ops/utils/test_pack.py tests/ops/utils/test_cumsum.py -k "not global"
set -uo pipefail
root=$(cd "$1" && pwd); bundles=$(cd "$2" && pwd); out=$(mkdir -p "$3" && cd "$3" && pwd); n=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
cache=$(mktemp -d)
cd "$root"
run() {   # name, Triton cache folder, pytest arguments besides the suite's
    local name=$1 dir=$2; shift 2
    local start=$SECONDS
    TRITON_CACHE_DIR=$dir python3 -m pytest -q -p no:cacheprovider "$@" --junitxml="$out/$name.xml" \
        > "$out/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s; $(tail -n 1 "$out/$name.log"); Triton cache files:" \
         "$(find "$dir" -type f 2>/dev/null | wc -l)"
}
run jit_cold "$cache/jit" -n "$n" "$@"
run jit_warm "$cache/jit" -n "$n" "$@"
run served "$cache/served" -n "$n" "$@" --kforge-bundles "$bundles" --kforge-strict
run one_process "$cache/one" -p no:xdist "$@" --kforge-bundles "$bundles" --kforge-strict
run verify "$cache/verify" -n "$n" "$@" --kforge-bundles "$bundles" --kforge-verify
for name in served one_process verify; do
    if [ -f "$out/$name.xml" ] && [ -f "$out/jit_cold.xml" ]; then
        echo "$name against jit_cold: $(python3 "$here/compare_junit.py" "$out/jit_cold.xml" -- "$out/$name.xml" | tail -n 1)"
    else
        echo "$name against jit_cold: no junit XML to compare (see $out/$name.log)"
    fi
done
