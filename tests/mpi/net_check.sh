#!/bin/sh
# net_check.sh BUILD "MPIRUN" HOSTS...: make test-mpi-net (issue 29, first
# part), with one rank per emulated host, over Open MPI's TCP path:
#   1. tests/mpi/test_mpi's agreement checks;
#   2. build-mpi/examples/gpt --dist (tiny, 4 steps, no dropout) writes the
#      checkpoint, bit for bit, and prints the losses that the same run over
#      shared memory (plain mpirun -np N on this host) does.
#
# Each host is a network namespace with a veth into a bridge of the root
# namespace; the links are shaped with tbf (this kernel has no netem, so no
# added delay yet). mpirun starts one orted per host through a fake rsh
# (`ip netns exec <host's namespace> sh -c ...`): ranks started by
# `ip netns exec` under one mpirun cannot reach its PMIx server from another
# namespace. Each orted has its own session directory, and the hwloc
# topology is not shared through a fixed-address segment (rtc_hwloc_vmhole
# none): several orteds of one machine raced for both. Everything this script creates carries its prefix and is torn
# down on exit, failure or interrupt, and the last check is that nothing of
# it is left. Root only (and ip, tc): otherwise it says so and skips.
build=$1
mpirun=$2
shift 2
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
    echo "make test-mpi-net: skipped: needs root and iproute2's ip and tc (network namespaces, veth, tbf)"
    exit 0
fi
p=nbq$(($$ % 10000))x       # names: at most 15 characters; the x ends the
                            # prefix, so no other run's (nbq123x) starts with ours (nbq12x)
net=10.$((100 + $$ % 100)).$(($$ / 100 % 200 + 1)) # a /24 of this run's own
tmp=$(mktemp -d)
rate=${NET_RATE:-10gbit}

cleanup() {
    for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^${p}n"); do ip netns del "$ns"; done
    ip link del "${p}b" 2> /dev/null
    # a veth's root-side end goes when its namespace is released, a moment later
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        ip -o link show | grep -q ": ${p}" || break
        sleep 0.5
    done
    for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${p}"); do ip link del "$l" 2> /dev/null; done
}
trap 'cleanup; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP

# hosts N: namespaces ${p}n1..N at $net.1..N, bridge ${p}b at $net.254
hosts() {
    ip link add "${p}b" type bridge && ip addr add "$net.254/24" dev "${p}b" && ip link set "${p}b" up || return 1
    : > "$tmp/hosts"
    printf '#!/bin/sh\nhost=$1; shift\ncase "$host" in\n' > "$tmp/rsh"
    i=1
    while [ "$i" -le "$1" ]; do
        ns=${p}n$i
        ip netns add "$ns" && ip link add "${p}h$i" type veth peer name "${p}r$i" &&
            ip link set "${p}h$i" netns "$ns" && ip -n "$ns" addr add "$net.$i/24" dev "${p}h$i" &&
            ip -n "$ns" link set "${p}h$i" up && ip -n "$ns" link set lo up &&
            ip link set "${p}r$i" master "${p}b" && ip link set "${p}r$i" up &&
            ip netns exec "$ns" tc qdisc add dev "${p}h$i" root tbf rate "$rate" burst 1mb latency 50ms || return 1
        echo "$net.$i slots=1" >> "$tmp/hosts"
        printf '%s) ns=%s ;;\n' "$net.$i" "$ns" >> "$tmp/rsh"
        i=$((i + 1))
    done
    # each host's orted gets a session directory of its own: on one /tmp
    # they raced to make the same one ("File exists")
    printf '*) echo "net_check rsh: unknown host $host" >&2; exit 1 ;;\nesac\n' >> "$tmp/rsh"
    printf 'mkdir -p "%s/$ns"\nexec ip netns exec "$ns" env OMPI_MCA_orte_tmpdir_base="%s/$ns" sh -c "$*"\n' \
        "$tmp" "$tmp" >> "$tmp/rsh"
    chmod +x "$tmp/rsh"
}

rc=0
for n in "$@"; do
    if ! hosts "$n"; then
        echo "make test-mpi-net: could not set up $n hosts (network namespaces, veth, bridge, tbf)"
        rc=1
        break
    fi
    out=$build/mpi/net-$n.log
    t0=$(date +%s)
    NABLA_NUM_THREADS=1 timeout 300 $mpirun --hostfile "$tmp/hosts" --mca plm_rsh_agent "$tmp/rsh" \
        --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" --mca rtc_hwloc_vmhole none \
        -x NABLA_NUM_THREADS -np "$n" "$(pwd)/$build/mpi/test_mpi" > "$out" 2>&1
    status=$?
    if [ "$status" -eq 0 ] && [ -x build-mpi/examples/gpt ]; then # 2
        g="--dist --config tiny --seq 32 --dropout 0 --batch 2 --steps 4"
        NABLA_NUM_THREADS=1 timeout 300 $mpirun -np "$n" build-mpi/examples/gpt $g \
            --save "$tmp/shm.ckpt" > "$tmp/shm.log" 2>&1 &&
            NABLA_NUM_THREADS=1 timeout 300 $mpirun --hostfile "$tmp/hosts" --mca plm_rsh_agent "$tmp/rsh" \
                --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" --mca rtc_hwloc_vmhole none \
                -x NABLA_NUM_THREADS --wdir "$(pwd)" -np "$n" "$(pwd)/build-mpi/examples/gpt" $g \
                --save "$tmp/net.ckpt" > "$tmp/net.log" 2>&1 || status=$?
        losses() { grep '^step [0-9]*: loss' "$1" | sed 's/ (.*//'; } # without the times
        if [ "$status" -eq 0 ] && cmp -s "$tmp/shm.ckpt" "$tmp/net.ckpt" &&
            [ "$(losses "$tmp/net.log" | wc -l)" -eq 4 ] &&
            [ "$(losses "$tmp/shm.log")" = "$(losses "$tmp/net.log")" ]; then
            echo "make test-mpi-net: $n hosts: gpt --dist wrote the checkpoint of shared memory bit for bit" \
                "($(wc -c < "$tmp/net.ckpt") bytes) with the same 4 losses"
        else
            cat "$tmp/shm.log" "$tmp/net.log"
            echo "make test-mpi-net: $n hosts: gpt --dist over TCP differs from shared memory (exit $status)"
            status=1
        fi
    fi
    sent=$(ip -n "${p}n1" -s link show "${p}h1" | awk '/TX:/{getline; print $1}')
    if [ "$status" -eq 0 ] && grep -q "Failures: 0, Errors: 0" "$out"; then
        echo "make test-mpi-net: $n hosts over TCP (veth + bridge, tbf $rate): test_mpi passed in" \
            "$(($(date +%s) - t0)) s, host 1 sent $sent bytes ($(grep -m1 -o 'Checks: [0-9]*' "$out"))"
    else
        cat "$out"
        echo "make test-mpi-net: $n hosts: test_mpi failed (exit $status)"
        rc=1
    fi
    cleanup
done
left=$( (ip netns list | sed 's/^/: /'; ip -o link show) | grep -c ": ${p}")
if [ "$left" -ne 0 ]; then
    echo "make test-mpi-net: $left namespaces or links of this run left behind"
    rc=1
else
    echo "make test-mpi-net: nothing left behind (no ${p}* namespace or link)"
fi
exit $rc
