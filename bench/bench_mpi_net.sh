#!/bin/sh
# bench_mpi_net.sh BUILD "MPIRUN": make bench-mpi-net (issue 29; root). GPT-2
# 124M data-parallel over Open MPI's TCP path between 2 emulated hosts
# (network namespaces joined by tests/mpi/net_relay.c, which holds every
# packet D us; tbf shapes each host's link), 1 rank x 1 thread per host, B=4
# rows per rank, T=64, AdamW, for links of 1, 10 and 25 Gb/s with a one-way
# delay of 0.1 and 1 ms. For each link:
#   - ms per step (median of steps 2-6), and beside it the same run over
#     shared memory (2 processes of this machine, plain mpirun) and one
#     process alone (the computation);
#   - the time exposed after backward (nb_ddp_sync's wait per step) and the
#     overlap (the share of the reduction window during backward);
#   - the reduction's bus bandwidth on 64 MiB, against the link's rate, and
#     its time on 4 KiB (latency);
#   - what docs/distributed.md's model predicts for that link.
# NET_BENCH="1gbit:100 ..." picks the links (rate:delay in us); NET_STEPS
# the steps (default 6); NET_REPORT_ONLY=1 prints the tables again from the
# last run's logs (BUILD/bench-mpi-net/) without running anything.
# NABLA_DDP_PARTIAL=0 reaches the ranks (whole gradients only, to compare).
build=$1
mpirun=$2
relay=${RELAY:-build/mpi/net_relay}
. tests/mpi/net_lib.sh
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null ||
    [ ! -c /dev/net/tun ]; then
    echo "make bench-mpi-net: skipped: needs root, iproute2's ip and tc, and /dev/net/tun"
    exit 0
fi
[ -x "$relay" ] || { echo "make bench-mpi-net: $relay is not built"; exit 1; }
net_init b 150
trap 'net_cleanup; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP
links=${NET_BENCH:-1gbit:100 1gbit:1000 10gbit:100 10gbit:1000 25gbit:100 25gbit:1000}
steps=${NET_STEPS:-6}
log=$build/bench-mpi-net
mkdir -p "$log"
export NABLA_NUM_THREADS=1 NABLA_DDP_PARTIAL=${NABLA_DDP_PARTIAL:-1}
gpt="$(pwd)/$build/examples/gpt"
args="--config gpt2 --tokenizer $(pwd)/tests/fixtures/gpt2/encoder.json --data $(pwd)/examples/data/kjv.txt --batch 4 --seq 64 --steps $steps --threads 1"

median_ms() { # median of "step N: loss X (Y ms)" for N >= 2
    awk '$1 == "step" && $2 + 0 >= 2 {sub(/\(/, "", $5); print $5}' "$1" | sort -n |
        awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "-"}'
}
# from the --dist line: "..., W ms from the first bucket's start ..., P% of it during backward, S ms in nb_ddp_sync"
dist_field() { # log, field: window overlap wait
    sed -n 's/.*per step, \([0-9.]*\) ms from.*averaged gradients, \([0-9]*\)% of it during backward, \([0-9.]*\) ms in nb_ddp_sync.*/\1 \2 \3/p' "$1" |
        awk -v f="$2" '{print f == "window" ? $1 : f == "overlap" ? $2 : $3}'
}
allreduce() { # log: "bus64 lat4k" (GB/s on 64 MiB, ms of nb_ddp_sync on 4 KiB)
    awk '$2 == "KiB" && $1 == 4 {lat = $6} $2 == "MiB" && $1 == 64 {bus = $8}
        END {print bus == "" ? "-" : bus, lat == "" ? "-" : lat}' "$1"
}

echo "make bench-mpi-net: $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs" \
    "($(grep -o -w -e avx512f -e avx512_bf16 -e amx_tile /proc/cpuinfo | sort -u | paste -sd, -)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "GPT-2 124M, B=4 rows per rank, T=64, f32, AdamW; 2 hosts x 1 rank x 1 thread; median of steps 2-$steps"
echo

keep=${NET_REPORT_ONLY:-}
# the computation alone, and 2 processes over shared memory
[ -n "$keep" ] || "$gpt" $args > "$log/1x1.log" 2>&1 || { cat "$log/1x1.log"; exit 1; }
[ -n "$keep" ] || $mpirun -np 2 "$gpt" --dist $args > "$log/shm.log" 2>&1 || { cat "$log/shm.log"; exit 1; }
[ -n "$keep" ] || $mpirun -np 2 "$build/mpi/mpi_allreduce" 4 65536 > "$log/shm-ar.log" 2>&1 || { cat "$log/shm-ar.log"; exit 1; }
c1=$(median_ms "$log/1x1.log")
printf "%-22s %9s %9s %8s %10s %9s %12s\n" link ms/step exposed overlap "bus GB/s" "of link" "4 KiB sync"
row() { # label, gpt log, allreduce log, rate in Gb/s (or -), delay in us (or -)
    set -- "$1" "$2" "$3" "$4" "$(median_ms "$2")" "$(dist_field "$2" wait)" "$(dist_field "$2" overlap)" $(allreduce "$3") \
        "$(dist_field "$2" window)" "$5"
    awk -v l="$1" -v r="$4" -v ms="$5" -v ex="$6" -v ov="$7" -v bus="$8" -v lat="$9" 'BEGIN {
        of = r == "-" ? "-" : sprintf("%.0f%%", 100 * bus * 8 / r)
        printf "%-22s %9s %6.1f ms %7s%% %10.2f %9s %9.2f ms\n", l, ms, ex, ov, bus, of, lat }'
    # for the model: rate delay ms exposed overlap window bus
    echo "$4 ${11} $5 $6 $7 ${10} $8" >> "$log/rows.txt"
}
echo "one process alone       $c1 ms/step (the computation)"
rm -f "$log/rows.txt"
row "shared memory" "$log/shm.log" "$log/shm-ar.log" - -

bench_link() { # one link: its hosts, gpt and the reduction, the relay's report
    # TCP buffers of up to 32 MB, as hosts tuned for a 25 Gb/s link would
    # have: a new namespace's 4 MB send limit caps a stream near 10 Gb/s at a
    # 2 ms RTT (make net-delay-check)
    if ! net_hosts_relay 2 "$us" || ! net_shape "$rate" || ! net_tcp_buffers 33554432; then
        cat "$tmp/relay.log"
        echo "make bench-mpi-net: could not set up 2 hosts ($rate, $us us)"
        exit 1
    fi
    m=$(net_mpi_args)
    timeout 900 $mpirun $m -x NABLA_NUM_THREADS -x NABLA_DDP_PARTIAL --wdir "$(pwd)" -np 2 "$gpt" --dist $args \
        > "$log/$name.log" 2>&1 || { cat "$log/$name.log"; exit 1; }
    timeout 900 $mpirun $m -x NABLA_NUM_THREADS -np 2 "$(pwd)/$build/mpi/mpi_allreduce" 4 65536 \
        > "$log/$name-ar.log" 2>&1 || { cat "$log/$name-ar.log"; exit 1; }
    net_cleanup
    cp "$tmp/relay.log" "$log/$name-relay.log"
}

for link in $links; do
    rate=${link%%:*} us=${link##*:}
    gbit=$(echo "$rate" | sed 's/gbit$//')
    name=$rate-${us}us
    [ -n "$keep" ] || bench_link
    row "$rate, $(awk -v u="$us" 'BEGIN {printf "%g", u / 1000}') ms" "$log/$name.log" "$log/$name-ar.log" "$gbit" "$us"
    awk -v l="$rate, $us us" '/hold us/ {printf "   net_relay %s: hold median %s us, p99 %s us;", l, $7, $9}
        /cpu s per GB/ {printf " %s CPU s per GB\n", $(NF - 4)}' "$log/$name-relay.log"
done
gb=$(sed -n 's/^--dist: 2 ranks; \([0-9.]*\) MB of gradients.*/\1/p' "$log/shm.log" | head -1)
relay_cpu=$(cat "$log"/*-relay.log | awk '/cpu s per GB/ {s += $(NF - 4); n++} END {if (n) printf "%.3f", s / n}')
echo
awk -v c="$c1" -v gb="$gb" -v relay="$relay_cpu" -f bench/net_model.awk "$log/rows.txt"
left=$(net_left)
[ "$left" -eq 0 ] || { echo "make bench-mpi-net: $left namespaces or links of this run left behind"; exit 1; }
