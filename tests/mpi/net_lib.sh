# net_lib.sh: emulated hosts for make test-mpi-net and make bench-mpi-net,
# sourced by their scripts (sh). Every name this run makes starts with
# $p (nb<tag><pid>x: the x ends the prefix, so no other run's names start
# with ours) and its addresses are in $net.0/24, a /24 of its own, only ever
# given to devices inside this run's namespaces.
#
#   net_init TAG BASE      sets p and net (10.BASE+pid%50.*), tmp (a folder)
#   net_hosts_relay N D    N hosts ${p}n1..N, each a namespace with a TUN
#                          ${p}t<i> at $net.<i> (and ${p}t0 at $net.254
#                          here, for mpirun), joined by net_relay holding
#                          every packet D us (an RTT of 2D); $relay is the
#                          relay program; its report goes to $tmp/relay.log
#   net_hosts_bridge N     N hosts ${p}n1..N, each a namespace with a veth
#                          ${p}h<i> at $net.<i> into a bridge ${p}b of this
#                          namespace at $net.254 (no delay)
#   net_shape RATE         tbf RATE on every host's device (egress)
#   net_tcp_buffers BYTES  TCP autotuning up to BYTES each way on every host
#   net_mpi_args           mpirun's options: one orted per host through an
#                          rsh agent that runs `ip netns exec`, hostfile,
#                          TCP only on $net.0/24
#   net_sysctl K=V...      sysctl K=V on every host (a namespace's own)
#   net_pids               the processes in the run's namespaces
#   net_cleanup            stops the relay, kills what runs in the run's
#                          namespaces, removes every namespace and link of the
#                          run (waits for veths' async release)
#   net_left               prints how many of the run's namespaces, links and
#                          qdiscs are left
net_init() {
    p=nb$1$(($$ % 10000))x
    net=10.$(($2 + $$ % 50)).$(($$ / 50 % 250 + 1))
    tmp=$(mktemp -d)
    rpid=
    : > "$tmp/hosts"
}

net_namespaces() { ip netns list 2> /dev/null | awk '{print $1}' | grep "^${p}n"; }
net_pids() { for ns in $(net_namespaces); do ip netns pids "$ns"; done; }

net_cleanup() {
    pids=$(net_pids)
    [ -z "$pids" ] || kill -9 $pids 2> /dev/null
    if [ -n "$rpid" ]; then
        kill "$rpid" 2> /dev/null
        wait "$rpid" 2> /dev/null
        rpid=
    fi
    for ns in $(net_namespaces); do ip netns del "$ns"; done
    ip link del "${p}b" 2> /dev/null
    # a veth's root-side end goes when its namespace is released, a moment later
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        ip -o link show | grep -q ": ${p}" || break
        sleep 0.5
    done
    for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${p}"); do ip link del "$l" 2> /dev/null; done
}

net_left() {
    (ip netns list | sed 's/^/: /'; ip -o link show; tc qdisc show | sed 's/ dev / : /') | grep -c ": ${p}"
}

# the rsh agent and hostfile for hosts 1..N (host i: $net.i in ${p}n<i>);
# each host's orted gets a session directory of its own (on one /tmp they
# raced to make the same one: "File exists")
net_rsh() {
    : > "$tmp/hosts"
    printf '#!/bin/sh\nhost=$1; shift\ncase "$host" in\n' > "$tmp/rsh"
    i=1
    while [ "$i" -le "$1" ]; do
        echo "$net.$i slots=1" >> "$tmp/hosts"
        printf '%s) ns=%s ;;\n' "$net.$i" "${p}n$i" >> "$tmp/rsh"
        i=$((i + 1))
    done
    printf '*) echo "net_lib rsh: unknown host $host" >&2; exit 1 ;;\nesac\n' >> "$tmp/rsh"
    printf 'mkdir -p "%s/$ns"\nexec ip netns exec "$ns" env OMPI_MCA_orte_tmpdir_base="%s/$ns" sh -c "$*"\n' \
        "$tmp" "$tmp" >> "$tmp/rsh"
    chmod +x "$tmp/rsh"
}

net_hosts_relay() {
    n=$1
    # mpirun stays in this namespace: its orteds reach it at $net.254
    specs="/proc/$$/ns/net:${p}t0:$net.254/24"
    i=1
    while [ "$i" -le "$n" ]; do
        ip netns add "${p}n$i" && ip -n "${p}n$i" link set lo up || return 1
        specs="$specs ${p}n$i:${p}t$i:$net.$i/24"
        i=$((i + 1))
    done
    "$relay" --delay-us "$2" $specs > "$tmp/relay.log" 2>&1 &
    rpid=$!
    for _ in $(seq 100); do # up when every device has its address
        up=0
        i=1
        while [ "$i" -le "$n" ]; do
            ip -n "${p}n$i" -o addr show dev "${p}t$i" 2> /dev/null | grep -q "$net.$i/" && up=$((up + 1))
            i=$((i + 1))
        done
        [ "$up" -eq "$n" ] && break
        kill -0 "$rpid" 2> /dev/null || return 1
        sleep 0.1
    done
    [ "$up" -eq "$n" ] || return 1
    net_rsh "$n"
}

net_hosts_bridge() {
    ip link add "${p}b" type bridge && ip addr add "$net.254/24" dev "${p}b" && ip link set "${p}b" up || return 1
    i=1
    while [ "$i" -le "$1" ]; do
        ns=${p}n$i
        ip netns add "$ns" && ip link add "${p}h$i" type veth peer name "${p}r$i" &&
            ip link set "${p}h$i" netns "$ns" && ip -n "$ns" addr add "$net.$i/24" dev "${p}h$i" &&
            ip -n "$ns" link set "${p}h$i" up && ip -n "$ns" link set lo up &&
            ip link set "${p}r$i" master "${p}b" && ip link set "${p}r$i" up || return 1
        i=$((i + 1))
    done
    net_rsh "$1"
}

net_shape() {
    for ns in $(net_namespaces); do
        dev=$(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${p}" | head -1)
        ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$1" burst 1mb latency 50ms || return 1
    done
}

net_sysctl() {
    for ns in $(net_namespaces); do ip netns exec "$ns" sysctl -q -w "$@" || return 1; done
}

net_tcp_buffers() { net_sysctl net.ipv4.tcp_rmem="4096 131072 $1" net.ipv4.tcp_wmem="4096 16384 $1"; }

net_mpi_args() {
    echo "--hostfile $tmp/hosts --mca plm_rsh_agent $tmp/rsh --mca btl tcp,self" \
        "--mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24" \
        "--mca rtc_hwloc_vmhole none --bind-to none"
}
