#!/bin/sh
# net_delay_check.sh BUILD: make net-delay-check (issue 29: links with delay
# on a kernel without netem). Two emulated hosts (network namespaces) joined
# by BUILD/mpi/net_relay (tests/mpi/net_relay.c: a TUN device in each, every
# packet held D us, so an RTT of 2D), measured with BUILD/mpi/net_probe
# (ICMP echo, one TCP stream each way):
#   1. RTT at D = 0, 100 and 1000 us, idle: checked to be 2D + the relay's
#      base RTT, and the hold the relay reports to be D;
#   2. TCP throughput one way and both ways at once, through tbf at 1, 10 and
#      25 Gb/s and unshaped, at each D, with the relay's CPU time per GB
#      delivered; at D = 100 and 1000 also with the namespaces' TCP buffer
#      limits (net.ipv4.tcp_rmem/tcp_wmem, per namespace) raised to 32 MB;
#   3. the same over a veth pair and a bridge, as tests/mpi/net_check.sh
#      joins its hosts (no delay), for comparison.
# It prints two tables. Checks: the RTTs and holds of 1, every transfer
# moved data, 1 Gb/s is reached through tbf (80%), the relay dropped nothing
# it should not, its TUN devices go when it exits, and nothing of the run
# (namespace, link) is left. NET_DELAY_SECONDS (default 3): each transfer.
# Root only (and ip, tc, /dev/net/tun): otherwise it says so and skips.
build=$1
relay=$build/mpi/net_relay
probe=$build/mpi/net_probe
secs=${NET_DELAY_SECONDS:-3}
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null || [ ! -c /dev/net/tun ]; then
    echo "make net-delay-check: skipped: needs root, iproute2's ip and tc, and /dev/net/tun"
    exit 0
fi
if [ ! -x "$relay" ] || [ ! -x "$probe" ]; then
    echo "make net-delay-check: $relay or $probe not built"
    exit 1
fi
. tests/mpi/net_lib.sh
net_init d 200 # 10.200-249.*: net_check.sh's and bench-mpi-net's are below
bgp= # the probes running in the background
rc=0
hz=$(getconf CLK_TCK)

cleanup() {
    for b in $bgp; do kill "$b" 2> /dev/null; done
    bgp=
    net_cleanup
}
trap 'cleanup; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP
fail() {
    echo "make net-delay-check: FAIL: $*"
    rc=1
}

echo "make net-delay-check: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
    "load average $(cut -d' ' -f1-3 /proc/loadavg); $secs s per transfer; hosts ${p}n1, ${p}n2 in $net.0/24"
for i in 1 2; do
    ip netns add "${p}n$i" && ip -n "${p}n$i" link set lo up || { fail "could not make namespace ${p}n$i"; exit 1; }
done
echo "make net-delay-check: a new namespace's TCP buffers: tcp_rmem $(ip netns exec "${p}n1" sysctl -n net.ipv4.tcp_rmem | tr '\t' ' ')," \
    "tcp_wmem $(ip netns exec "${p}n1" sysctl -n net.ipv4.tcp_wmem | tr '\t' ' ') (min default max bytes)"

# TCP buffer limits of both namespaces: "default" (as a new namespace has
# them) or "32MB" (autotuning up to 32 MB each way)
rmem0=$(ip netns exec "${p}n1" sysctl -n net.ipv4.tcp_rmem)
wmem0=$(ip netns exec "${p}n1" sysctl -n net.ipv4.tcp_wmem)
bufs() {
    for i in 1 2; do
        if [ "$1" = default ]; then
            ip netns exec "${p}n$i" sysctl -q -w net.ipv4.tcp_rmem="$rmem0" net.ipv4.tcp_wmem="$wmem0"
        else
            ip netns exec "${p}n$i" sysctl -q -w net.ipv4.tcp_rmem="4096 131072 33554432" \
                net.ipv4.tcp_wmem="4096 16384 33554432"
        fi
    done
}

relay_start() { # D: the relay between ${p}n1 and ${p}n2
    rm -f "$tmp/relay.out" # here: the child truncates it only after this shell looks
    "$relay" --delay-us "$1" "${p}n1:${p}t1:$net.1" "${p}n2:${p}t2:$net.2" > "$tmp/relay.out" 2> "$tmp/relay.err" &
    rpid=$!
    for _ in $(seq 50); do
        grep -q ready "$tmp/relay.out" 2> /dev/null && return 0
        kill -0 "$rpid" 2> /dev/null || break
        sleep 0.1
    done
    cat "$tmp/relay.err"
    fail "net_relay --delay-us $1 did not start"
    return 1
}
relay_stop() { # the report in $tmp/relay.err; its devices must be gone
    kill -TERM "$rpid"
    wait "$rpid"
    st=$?
    rpid=
    [ "$st" -eq 0 ] || { cat "$tmp/relay.err"; fail "net_relay exited with $st"; }
    for i in 1 2; do
        ! ip -n "${p}n$i" link show "${p}t$i" > /dev/null 2>&1 || fail "${p}t$i still in ${p}n$i after net_relay exited"
    done
    grep -q "write failed 0," "$tmp/relay.err" || { cat "$tmp/relay.err"; fail "net_relay failed to write packets"; }
}
relay_cpu() { # CPU seconds used by the relay so far
    awk -v hz="$hz" '{printf "%.3f", ($14 + $15) / hz}' "/proc/$rpid/stat"
}
shape() { # DEV RATE|none on both hosts
    for i in 1 2; do
        ip netns exec "${p}n$i" tc qdisc del dev "$1$i" root 2> /dev/null
        [ "$2" = none ] || ip netns exec "${p}n$i" tc qdisc add dev "$1$i" root tbf rate "$2" burst 1mb latency 50ms ||
            fail "tbf $2 on $1$i"
    done
}
ping_rtt() { # sets rmin rmed rmax (us)
    ip netns exec "${p}n1" "$probe" ping "$net.2" 200 5 > "$tmp/ping" || { cat "$tmp/ping"; fail "ping $net.2"; }
    read -r _ _ rmin _ rmed _ _ _ rmax _ < "$tmp/ping"
}
# transfer 1|2: one stream n1 -> n2, or one each way at once; sets $gbps
# (the Gb/s received; "a+b=sum" for 2) and $gbytes (GB received)
transfer() {
    ip netns exec "${p}n2" "$probe" sink 5001 $((secs + 20)) > "$tmp/sink2" &
    s2=$!
    bgp=$s2
    if [ "$1" -eq 2 ]; then
        ip netns exec "${p}n1" "$probe" sink 5001 $((secs + 20)) > "$tmp/sink1" &
        s1=$!
        ip netns exec "${p}n2" "$probe" send "$net.1" 5001 "$secs" > /dev/null &
        c2=$!
        bgp="$s2 $s1 $c2"
    fi
    ip netns exec "${p}n1" "$probe" send "$net.2" 5001 "$secs" > /dev/null || fail "send $net.1 -> $net.2"
    wait "$s2" || fail "sink $net.2"
    if [ "$1" -eq 2 ]; then
        wait "$c2" || fail "send $net.2 -> $net.1"
        wait "$s1" || fail "sink $net.1"
        gbytes=$(awk '{s += $3} END {printf "%.3f", s / 1e9}' "$tmp/sink1" "$tmp/sink2")
        gbps=$(cat "$tmp/sink2" "$tmp/sink1" | awk '{g[NR] = $7} END {printf "%.2f+%.2f=%.2f", g[1], g[2], g[1] + g[2]}')
    else
        gbytes=$(awk '{printf "%.3f", $3 / 1e9}' "$tmp/sink2")
        gbps=$(awk '{printf "%.2f", $7}' "$tmp/sink2")
    fi
    bgp=
}

# 1. RTT
printf '%s\n' "path         D(us)  RTT min   median    max (us)  median-2D  relay hold min/median/p99/max (us)" > "$tmp/rtt"
base=
for d in 0 100 1000; do
    relay_start "$d" || break
    ping_rtt
    relay_stop
    hold=$(awk '/hold us:/{print $5 "/" $7 "/" $9 "/" $11}' "$tmp/relay.err")
    med=$rmed
    [ -n "$base" ] || base=$med
    printf 'relay       %6d %8s %8s %8s %9.1f  %s\n' "$d" "$rmin" "$rmed" "$rmax" "$(echo "$med $d" | awk '{print $1 - 2 * $2}')" \
        "$hold" >> "$tmp/rtt"
    # RTT ~ 2D + base: within 10% of 2D + 100 us (the machine is shared)
    echo "$med $base $d" | awk '{e = $1 - $2 - 2 * $3; if (e < 0) e = -e; exit !(e <= 0.2 * $3 + 100)}' ||
        fail "RTT at D = $d us: median $med us, not 2D + $base us"
    hmed=$(echo "$hold" | cut -d/ -f2)
    echo "$hmed $d" | awk '{e = $1 - $2; if (e < 0) e = -e; exit !(e <= 0.05 * $2 + 20)}' ||
        fail "hold at D = $d us: median $hmed us"
done

# 2. throughput through the relay: a relay of its own for each line, so
# that its hold times are the line's
printf '%s\n' "path         D(us)  tbf     TCP bufs  one way Gb/s  cpu s/GB  both ways Gb/s        cpu s/GB  hold median/p99 (us)" > "$tmp/tput"
row() { # D rate bufs: one line of the table
    bufs "$3"
    relay_start "$1" || return 1
    shape "${p}t" "$2"
    c0=$(relay_cpu)
    transfer 1
    one=$gbps
    g1=$gbytes
    c1=$(relay_cpu)
    transfer 2
    two=$gbps
    g2=$gbytes
    c2=$(relay_cpu)
    relay_stop
    # the cpu cells: the relay's CPU seconds per GB received
    printf '%-12s %5s  %-7s %-8s  %12s  %8s  %-20s  %8s  %s\n' relay "$1" "$2" "$3" "$one" \
        "$(echo "$c0 $c1 $g1" | awk '{if ($3 > 0) printf "%.3f", ($2 - $1) / $3; else print "-"}')" "$two" \
        "$(echo "$c1 $c2 $g2" | awk '{if ($3 > 0) printf "%.3f", ($2 - $1) / $3; else print "-"}')" \
        "$(awk '/hold us:/{print $7 "/" $9}' "$tmp/relay.err")" >> "$tmp/tput"
    [ "$2" != 1gbit ] || echo "$one" | awk '{exit !($1 >= 0.8)}' || fail "relay D=$1: $one Gb/s through tbf 1gbit"
    grep -q "not IPv4 0, unknown destination 0, ring full 0, write failed 0," "$tmp/relay.err" || grep "drops:" "$tmp/relay.err" | sed "s/^net_relay:/make net-delay-check: D = $1 us, tbf $2, bufs $3: net_relay's/"
}
for d in 0 100 1000; do
    for r in none 25gbit 10gbit 1gbit; do
        row "$d" "$r" default
    done
    if [ "$d" -gt 0 ]; then
        for r in none 25gbit; do
            row "$d" "$r" 32MB
        done
        bufs default
    fi
done

# 3. veth + bridge, as tests/mpi/net_check.sh (no delay)
ip link add "${p}b" type bridge && ip link set "${p}b" up || fail "bridge ${p}b"
for i in 1 2; do
    ip link add "${p}h$i" type veth peer name "${p}r$i" && ip link set "${p}h$i" netns "${p}n$i" &&
        ip -n "${p}n$i" addr add "$net.$i/24" dev "${p}h$i" && ip -n "${p}n$i" link set "${p}h$i" up &&
        ip link set "${p}r$i" master "${p}b" && ip link set "${p}r$i" up || fail "veth ${p}h$i"
done
ping_rtt
printf 'veth+bridge      - %8s %8s %8s\n' "$rmin" "$rmed" "$rmax" >> "$tmp/rtt"
for r in none 25gbit; do
    shape "${p}h" "$r"
    transfer 1
    one=$gbps
    transfer 2
    printf '%-12s %5s  %-7s %-8s  %12s  %8s  %-20s\n' veth+bridge - "$r" default "$one" - "$gbps" >> "$tmp/tput"
done

echo "make net-delay-check: RTT (ICMP echo, 200 at 5 ms intervals, idle links):"
sed 's/^/    /' "$tmp/rtt"
echo "make net-delay-check: TCP throughput, one stream each way ($secs s; cpu: the relay's user+sys seconds per GB received):"
sed 's/^/    /' "$tmp/tput"
echo "make net-delay-check: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"

cleanup
left=$(net_left)
if [ "$left" -ne 0 ]; then
    fail "$left namespaces or links of this run left behind"
else
    echo "make net-delay-check: nothing left behind (no ${p}* namespace or link)"
fi
if [ "$rc" -eq 0 ]; then
    echo "make net-delay-check: passed"
else
    echo "make net-delay-check: failed (the FAIL lines above)"
fi
exit $rc
