#!/bin/sh
# bench_mpi.sh BUILD "MPIRUN": make bench-mpi's figures (docs/distributed.md).
#   1. GPT-2 124M training steps (B=4 rows per process, T=64, AdamW), with
#      BUILD/examples/gpt built with MPI: 1 process x 1 thread, 1 process x 2
#      threads, 2 processes x 1 thread (--dist), and 2 x 1 with AdamW's state
#      sharded (--dist --zero): the median of steps 2-6, the tokens per
#      second (2 processes do twice the rows per step), and each process's
#      peak RSS (from /usr/bin/time when installed);
#   2. the reduction between 2 processes (BUILD/mpi/mpi_allreduce);
#   3. memory per process with and without sharded optimizer state on 2
#      ranks (section 1's runs) and 4 ranks (2 steps each, for memory only),
#      against what AdamW's state takes.
build=$1
mpirun=$2
gpt=$build/examples/gpt
args="--config gpt2 --tokenizer tests/fixtures/gpt2/encoder.json --batch 4 --seq 64 --steps 6"
log=$build/bench-mpi

# run NAME NP ARGS...: gpt ARGS on NP processes (1: alone, else mpirun and
# --dist) into $log/NAME.log; each process's peak RSS (/usr/bin/time, when
# installed) appended to $log/NAME.rss
run() {
    name=$1 np=$2
    shift 2
    rm -f "$log/$name.rss"
    t=""
    [ -x /usr/bin/time ] && t="/usr/bin/time -a -o $log/$name.rss -f peak-rss-kb=%M"
    if [ "$np" = 1 ]; then $t "$gpt" "$@"; else $mpirun -np "$np" $t "$gpt" --dist "$@"; fi \
        > "$log/$name.log" 2>&1 || { cat "$log/$name.log"; exit 1; }
}

# median of "step N: loss X (Y ms)" for N >= 2, one line per process
median_ms() {
    awk '$1 == "step" && $2 + 0 >= 2 {sub(/\(/, "", $5); print $5}' "$1" | sort -n |
        awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "-"}'
}
rss_mib() { # NAME: each process's peak RSS
    [ -e "$log/$1.rss" ] && awk -F= '/^peak-rss-kb=/ {printf "%s%.0f", sep, $2 / 1024; sep = " / "}' "$log/$1.rss"
}
mean_rss() { # NAME: their mean
    [ -e "$log/$1.rss" ] || { echo -; return; }
    awk -F= '/^peak-rss-kb=/ {s += $2; n++} END {if (n) printf "%.0f", s / n / 1024; else print "-"}' "$log/$1.rss"
}

mkdir -p "$log"
echo "make bench-mpi: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "1. GPT-2 124M training step (B=4 rows per process, T=64, tied, f32, AdamW; median of steps 2-6)"
printf "%-26s %10s %12s %22s\n" "processes x threads" "ms/step" "tokens/s" "peak RSS per process"
row() { # label, rows per step, NAME
    ms=$(median_ms "$log/$3.log")
    tps=$(awk -v ms="$ms" -v rows="$2" 'BEGIN {if (ms == "-") print "-"; else printf "%.0f", rows * 64 / (ms / 1000)}')
    rss=$(rss_mib "$3")
    printf "%-26s %10s %12s %18s MiB\n" "$1" "$ms" "$tps" "${rss:--}"
}
run 1x1 1 $args --threads 1
row "1 x 1" 4 1x1
run 1x2 1 $args --threads 2
row "1 x 2" 4 1x2
run 2x1 2 $args --threads 1
row "2 x 1 (--dist)" 8 2x1
run 2x1z 2 $args --threads 1 --zero
row "2 x 1 (--dist --zero)" 8 2x1z
grep -h '^--dist' "$log/2x1.log" | sed 's/^--dist: /   --dist: /'
grep -h '^--dist' "$log/2x1z.log" | sed 's/^--dist: /   --dist --zero: /'
echo
echo "2. gradient reduction between 2 processes, f32 (median of 7; bus bandwidth = 2(N-1)/N x bytes / time)"
$mpirun -np 2 "$build/mpi/mpi_allreduce" || exit 1
echo
echo "3. memory per process (mean peak RSS of the ranks), AdamW state sharded (ZeRO stage 1, --zero) or not"
params=$(awk '/parameters$/ {for (i = 1; i < NF; i++) if ($(i + 1) == "parameters") print $i}' "$log/1x1.log" | tr -d 'M')
# 4 ranks on this machine's cores: for memory only (2 steps; their times mean nothing)
run 4x1 4 --config gpt2 --tokenizer tests/fixtures/gpt2/encoder.json --batch 4 --seq 64 --steps 2 --threads 1
run 4x1z 4 --config gpt2 --tokenizer tests/fixtures/gpt2/encoder.json --batch 4 --seq 64 --steps 2 --threads 1 --zero
printf "%-8s %16s %16s %8s %26s\n" ranks "without --zero" "with --zero" saved "AdamW state per rank"
for n in 2 4; do
    a=$(mean_rss ${n}x1)
    b=$(mean_rss ${n}x1z)
    awk -v n=$n -v a="$a" -v b="$b" -v m="$params" 'BEGIN {
        state = 2 * m * 1e6 * 4 / 1048576   # exp_avg and exp_avg_sq, f32
        if (a == "-" || b == "-") { printf "%-8d %16s %16s %8s %14.0f -> ~%.0f MiB\n", n, "-", "-", "-", state, state / n; exit }
        printf "%-8d %12d MiB %12d MiB %4d MiB %14.0f -> ~%.0f MiB\n", n, a, b, a - b, state, state / n
    }'
done
echo "   (one process alone: $(mean_rss 1x1) MiB; the state is split by whole tensors, so 1/N is approximate)"
