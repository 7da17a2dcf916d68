#!/bin/sh
# bench_mpi.sh BUILD "MPIRUN": make bench-mpi's figures (docs/distributed.md).
#   1. GPT-2 124M training steps (B=4 rows per process, T=64, AdamW), with
#      BUILD/examples/gpt built with MPI: 1 process x 1 thread, 1 process x 2
#      threads, 2 processes x 1 thread (--dist), and 2 x 1 with AdamW's state
#      sharded (--dist --zero): the median of steps 2-6, the tokens per
#      second (2 processes do twice the rows per step), and each process's
#      peak RSS (from /usr/bin/time when installed);
#   2. the reduction between 2 processes (BUILD/mpi/mpi_allreduce);
#   3. memory per process with and without sharded optimizer state (the
#      peak RSS of section 1, against what AdamW's state takes).
build=$1
mpirun=$2
gpt=$build/examples/gpt
args="--config gpt2 --batch 4 --seq 64 --steps 6"
timer=""
[ -x /usr/bin/time ] && timer="/usr/bin/time -f peak-rss-kb=%M"
log=$build/bench-mpi

# median of "step N: loss X (Y ms)" for N >= 2, one line per process
median_ms() {
    awk '$1 == "step" && $2 + 0 >= 2 {sub(/\(/, "", $5); print $5}' "$1" | sort -n |
        awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "-"}'
}
rss_mib() {
    awk -F= '/^peak-rss-kb=/ {printf "%s%.0f", sep, $2 / 1024; sep = " / "}' "$1"
}

mkdir -p "$log"
echo "make bench-mpi: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "1. GPT-2 124M training step (B=4 rows per process, T=64, tied, f32, AdamW; median of steps 2-6)"
printf "%-26s %10s %12s %22s\n" "processes x threads" "ms/step" "tokens/s" "peak RSS per process"
row() { # label, rows per step, log
    ms=$(median_ms "$3")
    tps=$(awk -v ms="$ms" -v rows="$2" 'BEGIN {if (ms == "-") print "-"; else printf "%.0f", rows * 64 / (ms / 1000)}')
    rss=$(rss_mib "$3")
    printf "%-26s %10s %12s %18s MiB\n" "$1" "$ms" "$tps" "${rss:--}"
}
$timer "$gpt" $args --threads 1 > "$log/1x1.log" 2>&1 || { cat "$log/1x1.log"; exit 1; }
row "1 x 1" 4 "$log/1x1.log"
$timer "$gpt" $args --threads 2 > "$log/1x2.log" 2>&1 || { cat "$log/1x2.log"; exit 1; }
row "1 x 2" 4 "$log/1x2.log"
$mpirun -np 2 $timer "$gpt" $args --threads 1 --dist > "$log/2x1.log" 2>&1 || { cat "$log/2x1.log"; exit 1; }
row "2 x 1 (--dist)" 8 "$log/2x1.log"
$mpirun -np 2 $timer "$gpt" $args --threads 1 --dist --zero > "$log/2x1z.log" 2>&1 || { cat "$log/2x1z.log"; exit 1; }
row "2 x 1 (--dist --zero)" 8 "$log/2x1z.log"
echo
echo "2. gradient reduction between 2 processes, f32 (median of 7; bus bandwidth = 2(N-1)/N x bytes / time)"
$mpirun -np 2 "$build/mpi/mpi_allreduce" || exit 1
echo
echo "3. memory per process, sharded optimizer state (ZeRO stage 1, --zero) or not"
mean_rss() { awk -F= '/^peak-rss-kb=/ {s += $2; n++} END {if (n) printf "%.0f", s / n / 1024; else print "-"}' "$1"; }
plain=$(mean_rss "$log/2x1.log")
zero=$(mean_rss "$log/2x1z.log")
params=$(awk '/parameters$/ {for (i = 1; i < NF; i++) if ($(i + 1) == "parameters") print $i}' "$log/1x1.log" | tr -d 'M')
awk -v p="$plain" -v z="$zero" -v m="$params" 'BEGIN {
    if (p == "-" || z == "-") { print "   (no /usr/bin/time: peak RSS not measured)"; exit }
    state = 2 * m * 1e6 * 4 / 1048576   # exp_avg and exp_avg_sq, f32
    printf "   2 ranks, mean peak RSS per process: %d MiB without --zero, %d MiB with (%.0f%% less)\n", p, z, 100 * (p - z) / p
    printf "   AdamW state of %.2fM parameters: %.0f MiB; sharded over N ranks each keeps about 1/N,\n", m, state
    printf "   so the saving at 2 ranks should be about %.0f MiB; it was %d MiB\n", state / 2, p - z
}'
