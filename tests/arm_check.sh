#!/usr/bin/env bash
# make test-arm's runs (Makefile): the suites of an aarch64 build under
# qemu-aarch64 user emulation, once per instruction-set path of aarch64
# (tensor/cpu_internal.h): NABLA_ISA=portable, neon and neon-bf16 on QEMU's
# "max" CPU (NEON, FEAT_BF16, SVE), sve at vector lengths of 16, 32 and 64
# bytes; then CPUs that lack what max has, where detection must fall back:
# cortex-a57 (NEON only) and a64fx (SVE without BF16).
#
#   tests/arm_check.sh BUILD [CLANG_BUILD]
#
# BUILD holds tests/run_tests and fuzz/replay, CLANG_BUILD clang's
# tests/run_tests (one run on max, at the path it detects). The suites of
# each run (emulation is 10-100 times slower than a CPU, so not all of them):
#   ARM_SUITES: every path and vector length (the kernels: products, bf16,
#     softmax and vector math, reductions, an optimizer, the same bits on
#     1-3 threads, the blocks sized from the CPU);
#   ARM_SUITES_WIDE: added on neon and on sve at 32 bytes (convolutions,
#     layer norm and the modules);
#   ARM_SUITES_BF16: neon-bf16's run (its kernels are the bf16 ones; its f32
#     kernels are neon's);
#   ARM_SUITES_FALLBACK: the other CPUs' runs and clang's.
# ARM_JOBS: runs at once (2). Each run prints the path it took, its checks
# and its time; its log is BUILD/test-arm/NAME.log.
#
set -u
build=${1:?usage: tests/arm_check.sh BUILD [CLANG_BUILD]}
clang_build=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
sysroot=${ARM_SYSROOT:-/usr/aarch64-linux-gnu}
jobs=${ARM_JOBS:-2}
suites=${ARM_SUITES:-matmul gemm_bf16 bf16 softmax elementwise reduce optim threads cpu}
wide=${ARM_SUITES_WIDE:-conv nn}
bf16_suites=${ARM_SUITES_BF16:-matmul gemm_bf16 bf16 softmax elementwise threads nn}
fallback_suites=${ARM_SUITES_FALLBACK:-gemm_bf16 bf16 cpu}
logs=$build/test-arm
mkdir -p "$logs"
rm -f "$logs"/*.log "$logs"/*.result

# The loader and libc of the cross toolchain (qemu -L), and its libraries
# first: ld.so.cache would otherwise hand the cross ld.so the libc of an
# installed libc6:arm64 (multiarch, for Check's libsubunit), and a process
# whose loader and libc differ hangs in fork (Check forks every test).
qemu() { # qemu CPU ENV... -- PROGRAM ARGS...
    local cpu=$1
    shift
    local envs=()
    while [ "$1" != -- ]; do envs+=(-E "$1"); shift; done
    shift
    qemu-aarch64-static -cpu "$cpu" -L "$sysroot" -E LD_LIBRARY_PATH="$sysroot/lib" "${envs[@]}" "$@"
}

paths=(portable neon neon-bf16 sve)
rank() { # the position of a path in the list above (-1: none)
    local i
    for i in "${!paths[@]}"; do [ "${paths[$i]}" = "$1" ] && { echo "$i"; return; }; done
    echo -1
}

# What the binary of $1 says under CPU $2 with NABLA_ISA $3 (empty: unset):
# "path-in-use best sve-bytes".
cpu_of() {
    local isa_env=NB_TEST_PRINT_CPU=1
    [ -n "$3" ] && isa_env="NABLA_ISA=$3"
    qemu "$2" NB_TEST_PRINT_CPU=1 "$isa_env" -- "$1/tests/run_tests" 2>/dev/null
}

read -r _ max_best _ <<< "$(cpu_of "$build" max "")"
if [ -z "${max_best:-}" ]; then
    echo "test-arm: $build/tests/run_tests does not run under qemu-aarch64-static -cpu max"
    qemu max -- "$build/tests/run_tests" < /dev/null 2>&1 | head -5
    exit 1
fi
strict=1
if [ "$max_best" = portable ]; then
    strict=0
    echo "test-arm: note: this build detects no aarch64 path beyond portable on qemu's max CPU" \
        "(NEON, BF16, SVE): every run below takes portable"
fi

# One run: NAME CPU NABLA_ISA(or "") WANT_PATH WANT_VL BINARY_BUILD SUITES
# (WANT_*: what the path in use must be under strict; "-": anything).
one_run() {
    local name=$1 cpu=$2 isa=$3 want=$4 want_vl=$5 bin=$6 list=$7 log=$logs/$1.log
    local t0=$SECONDS inuse best vl ok=1 why=""
    read -r inuse best vl <<< "$(cpu_of "$bin" "$cpu" "$isa")"
    [ -n "$isa" ] && [ "$(rank "$inuse")" -gt "$(rank "$isa")" ] &&
        { ok=0; why="path $inuse is above NABLA_ISA=$isa"; }
    if [ "$strict" = 1 ] && [ "$want" != - ] && [ "$inuse" != "$want" ]; then
        ok=0; why="path $inuse, not $want"
    fi
    if [ "$strict" = 1 ] && [ "$want_vl" != - ] && [ "$vl" != "$want_vl" ]; then
        ok=0; why="SVE vector length $vl bytes, not $want_vl"
    fi
    # NB_TEST_REDUCED: the threads suite's valgrind sizes; the timeouts
    # (hang guards) stretched as for a 10 times slower CPU
    local envs=(CK_VERBOSITY=normal "CK_RUN_SUITE=$list" NB_TEST_REDUCED=1
        CK_TIMEOUT_MULTIPLIER=${ARM_TIMEOUT_MULTIPLIER:-10})
    [ -n "$isa" ] && envs+=("NABLA_ISA=$isa")
    qemu "$cpu" "${envs[@]}" -- "$bin/tests/run_tests" > "$log" 2>&1
    local rc=$?
    local checks
    checks=$(awk '/^[0-9]+%: Checks: / {gsub(",", ""); c += $3; f += $5; e += $7} END \
        {printf "%d checks, %d failures, %d errors", c, f, e}' "$log")
    [ $rc = 0 ] || { ok=0; why="${why:+$why; }suites failed (exit $rc)"; }
    local desc="qemu -cpu $cpu${isa:+, NABLA_ISA=$isa}"
    printf '%s %s|%s|%s|%s|%s|%s|%d\n' "$ok" "$name" "$desc" "$inuse${vl:+ (CPU best $best, SVE $vl bytes)}" \
        "$list" "$checks" "$why" $((SECONDS - t0)) > "$logs/$name.result"
}

# the longest first, so that the last ones fill the gaps
runs=(
    "neon|max|neon|neon|-|$build|$suites $wide"
    "sve-vl32|max,sve-default-vector-length=32|sve|sve|32|$build|$suites $wide"
    "portable|max|portable|portable|-|$build|$suites"
    "sve-vl16|max,sve-default-vector-length=16|sve|sve|16|$build|$suites"
    "sve-vl64|max,sve-default-vector-length=64|sve|sve|64|$build|$suites"
    "neon-bf16|max|neon-bf16|neon-bf16|-|$build|$bf16_suites"
    "cortex-a57|cortex-a57||neon|-|$build|$fallback_suites"
    "cortex-a57-capped|cortex-a57|sve|neon|-|$build|cpu"
    "a64fx|a64fx||sve|-|$build|$fallback_suites"
)
[ -n "$clang_build" ] && runs+=("clang|max||sve|-|$clang_build|$fallback_suites")

t_all=$SECONDS
running=0
for r in "${runs[@]}"; do
    IFS='|' read -r name cpu isa want vl bin list <<< "$r"
    [ "$strict" = 1 ] || { want=-; vl=-; }
    one_run "$name" "$cpu" "$isa" "$want" "$vl" "$bin" "$list" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

# The op fuzzer's seed corpus (fuzz/replay): every op against its reference,
# each program on the path its first byte picks (best, portable, neon,
# neon-bf16), on max.
t0=$SECONDS
if qemu max -- "$build/fuzz/replay" "$root/fuzz/corpus/ops" > "$logs/replay.log" 2>&1; then
    replay="ok: $(tail -1 "$logs/replay.log")"
else
    replay="FAILED (see $logs/replay.log)"
fi
replay_t=$((SECONDS - t0))

fail=0
echo "test-arm: the suites under qemu-aarch64, one run per path and CPU ($build):"
for r in "${runs[@]}"; do
    name=${r%%|*}
    if [ ! -f "$logs/$name.result" ]; then
        echo "  FAIL $name: no result"; fail=1; continue
    fi
    IFS='|' read -r ok desc inuse list checks why t < "$logs/$name.result"
    ok=${ok%% *}
    if [ "$ok" = 1 ]; then
        printf '  ok   %-18s %4d s  %s: path %s; %s\n' "$name" "$t" "$desc" "$inuse" "$checks"
    else
        fail=1
        printf '  FAIL %-18s %4d s  %s: path %s; %s: %s\n' "$name" "$t" "$desc" "$inuse" "$checks" "$why"
        grep -E '^[^ ]+:[0-9]+:[EF]:' "$logs/$name.log" | head -10 | sed 's/^/       /'
        echo "       (suites: $list; log: $logs/$name.log)"
    fi
done
case $replay in ok*) printf '  ok   %-18s %4d s  fuzz/replay fuzz/corpus/ops on max: %s\n' replay "$replay_t" "${replay#ok: }";;
    *) fail=1; printf '  FAIL %-18s %4d s  fuzz/replay fuzz/corpus/ops on max: %s\n' replay "$replay_t" "$replay"; tail -5 "$logs/replay.log";;
esac
echo "test-arm: $([ $fail = 0 ] && echo "every run passed" || echo FAILED) in $((SECONDS - t_all)) s"
exit $fail
