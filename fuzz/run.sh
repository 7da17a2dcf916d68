#!/bin/sh
# fuzz/run.sh TARGET SECONDS [libFuzzer options...]: runs build-fuzz/fuzz_TARGET
# for SECONDS on a copy of fuzz/corpus/TARGET (the committed corpus is not
# grown), logs to build-fuzz/fuzz_TARGET.log and prints a one-line summary.
# Exit status: the fuzzer's (non-zero when it found a crash).
set -u
t=$1 secs=$2
shift 2
bin=build-fuzz/fuzz_$t corpus=build-fuzz/corpus-$t art=build-fuzz/artifacts-$t
log=build-fuzz/fuzz_$t.log
rm -rf "$corpus" "$art"
mkdir -p "$art"
cp -r "fuzz/corpus/$t" "$corpus"
seeds=$(ls "$corpus" | wc -l)
echo "fuzz_$t: $secs s from $seeds seeds (log: $log)"
NABLA_NUM_THREADS=1 "$bin" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$art/" "$@" "$corpus" > "$log" 2>&1
rc=$?
awk -v t="fuzz_$t" -v rc="$rc" -v corp="$(ls "$corpus" | wc -l)" \
    -v crashes="$(ls "$art" | wc -l)" '
    / cov: / { for (i = 1; i <= NF; i++) { if ($i == "cov:") c = $(i + 1); if ($i == "ft:") f = $(i + 1) } }
    /^Done [0-9]+ runs in/ { secs = $5 }
    /stat::number_of_executed_units:/ { execs = $2 }
    /stat::average_exec_per_sec:/ { eps = $2 }
    END {
        printf "%s: %s s, %s execs (%s/s), cov %s ft %s, corpus %s inputs, crashes %s%s\n",
               t, secs == "" ? "?" : secs, execs, eps, c, f, corp, crashes,
               rc ? " -- FAILED (exit " rc "), see the log" : ""
    }' "$log"
if [ "$rc" != 0 ]; then
    grep -E "MISMATCH|check failed|ERROR: |SUMMARY: |Test unit written" "$log" | head -8
fi
exit "$rc"
