#!/usr/bin/env bash
# A real test suite on Triton's JIT and served from kforge bundles, side by side, on one GPU machine:
#   bash bench/liger_suite.sh LIGER_CHECKOUT BUNDLES OUT_DIR [pytest-xdist workers, default 16]
# LIGER_CHECKOUT: a clone of liger-kernel's repository (its test/ folder; the installed liger-kernel is tested).
# BUNDLES: out/dist of a project that built the suite's record (pytest --kforge-record specs/tests.jsonl).
# Writes OUT_DIR/{jit_cold,jit_warm,served,verify}.xml and .log; compare with bench/compare_junit.py.
set -uo pipefail
liger=$(cd "$1" && pwd); bundles=$(cd "$2" && pwd); out=$(mkdir -p "$3" && cd "$3" && pwd); n=${4:-16}
files="rms_norm layer_norm kl_div jsd dyt group_norm fused_add_rms_norm tvd qwen2vl_mrope softmax sparsemax"
tests=$(for f in $files; do echo "test/transformers/test_$f.py"; done)
cache=$(mktemp -d)
cd "$liger"
run() {   # name, Triton cache folder, extra pytest arguments
    local name=$1 dir=$2; shift 2
    local start=$SECONDS
    TRITON_CACHE_DIR=$dir python3 -m pytest -q -p no:cacheprovider -n "$n" $tests --junitxml="$out/$name.xml" "$@" \
        > "$out/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s; $(tail -n 1 "$out/$name.log"); Triton cache files:" \
         "$(find "$dir" -type f 2>/dev/null | wc -l)"
}
run jit_cold "$cache/jit"
run jit_warm "$cache/jit"
run served "$cache/served" --kforge-bundles "$bundles" --kforge-strict
run verify "$cache/verify" --kforge-bundles "$bundles" --kforge-verify
python3 "$(dirname "$0")/compare_junit.py" "$out/jit_cold.xml" "$out/served.xml" | tail -n 1
