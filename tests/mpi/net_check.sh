#!/bin/sh
# net_check.sh BUILD "MPIRUN" HOSTS...: make test-mpi-net (issue 29, first
# part), with one rank per emulated host, over Open MPI's TCP path, on each
# host count:
#   1. tests/mpi/test_mpi's agreement checks;
#   2. build-mpi/examples/gpt --dist (tiny, 4 steps, no dropout) writes the
#      checkpoint, bit for bit, and prints the losses that the same run over
#      shared memory (plain mpirun -np N on this host) does;
#   3. resume across host counts (as examples_check.sh's check 4): a gpt
#      --dist --zero checkpoint of step 3 written on the first host count
#      (2), resumed on each later one (4), plain and --zero, with the same
#      global batch (8 rows): steps 4-6 print the losses of the
#      uninterrupted run on the first count, to the 6 digits printed;
#   4. a host whose rank is killed: BUILD/mpi/fault train runs, and the
#      last host's rank gets SIGKILL from outside (its pid in its
#      namespace): mpirun must end (nonzero, not stopped by the 300 s hang
#      guard; the time is printed, not judged) with its message naming the
#      rank, its pid and signal 9, and no process of the run may remain.
#      Now and then (once in 29 kills here) a rank that writes to the dead one's
#      socket dies of SIGPIPE first, and mpirun names that rank and signal
#      13 instead: then the killed host must be the "Peer host" of Open
#      MPI's "peer hung up" message;
#   5. a link taken down mid-step: the same training, and the last host's
#      veth is set down on the bridge side (a pulled cable). Every rank,
#      the cut-off one too, must print nabla's timeout message
#      (NABLA_MPI_TIMEOUT=5) and mpirun must end (about 20 s here; judged
#      only by the hang guard), no process of
#      the run remaining. The cut-off rank's message cannot reach mpirun:
#      each host's orted also writes its ranks' output to a file
#      (--output-filename), which is where the test reads every rank's.
#      mpirun runs on host 1 here, as on a cluster's first node, because
#      after the ranks' MPI_Abort it resends its kill order to the cut-off
#      host's orted until TCP gives up: 15 retries (net.ipv4.tcp_retries2,
#      Linux's default) take about 15 minutes, so each emulated host is set
#      to 5 (about 13 s), which only a namespace of the test's own may be.
#      Every mpirun is under timeout, so a hang fails the test.
#
# Each host is a network namespace with a veth into a bridge of the root
# namespace (tests/mpi/net_lib.sh); the links are shaped with tbf (delays
# come from tests/mpi/net_relay.c, in make bench-mpi-net). mpirun starts one orted per host through a fake rsh
# (`ip netns exec <host's namespace> sh -c ...`): ranks started by
# `ip netns exec` under one mpirun cannot reach its PMIx server from another
# namespace. Each orted has its own session directory, and the hwloc
# topology is not shared through a fixed-address segment (rtc_hwloc_vmhole
# none): several orteds of one machine raced for both. Everything this
# script creates carries its prefix and is torn down on exit, failure or
# interrupt (a process of the run still in one of its namespaces is killed
# by its pid first), and the last check is that nothing of it is left
# (namespace, link, qdisc). Root only (and ip, tc): otherwise it says so and
# skips.
build=$1
mpirun=$2
shift 2
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
    echo "make test-mpi-net: skipped: needs root and iproute2's ip and tc (network namespaces, veth, tbf)"
    exit 0
fi
rate=${NET_RATE:-10gbit}
. tests/mpi/net_lib.sh
net_init q 100
say() { echo "make test-mpi-net: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
trap 'net_cleanup; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP

# hosts N: namespaces ${p}n1..N at $net.1..N, a bridge ${p}b at $net.254,
# links shaped; TCP gives up on a dead peer after 5 retries (about 13 s;
# Linux's default 15 take about 15 minutes: see 5.)
hosts() { net_hosts_bridge "$1" && net_shape "$rate" && net_sysctl net.ipv4.tcp_retries2=5; }

# mpirun's options for the emulated hosts
over="$(net_mpi_args) -x NABLA_NUM_THREADS"
export NABLA_NUM_THREADS=1
losses() { grep '^step [0-9]*: loss' "$1" | sed 's/ (.*//'; } # without the times
g="--config tiny --seq 32 --dropout 0"
gpt() { # log-name hosts args...: gpt --dist over the emulated hosts
    name=$1 np=$2; shift 2
    timeout 300 $mpirun $over --wdir "$(pwd)" -np "$np" "$(pwd)/build-mpi/examples/gpt" --dist "$@" \
        > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; say "$np hosts: gpt --dist $* failed"; return 1; }
}

# fault N MODE: BUILD/mpi/fault train on N hosts, mpirun on host 1; once
# every rank has done 20 steps, the last host's rank is killed (MODE kill)
# or its link is taken down on the bridge side (MODE down)
fault() {
    n=$1 mode=$2 of=$build/mpi/net-$2-$1.ranks out=$build/mpi/net-$2-$1.log last=$(($1 - 1))
    rm -rf "$of"
    NABLA_MPI_TIMEOUT=5 timeout 300 ip netns exec "${p}n1" $mpirun $over -x NABLA_MPI_TIMEOUT \
        --output-filename "$of" -np "$n" "$(pwd)/$build/mpi/fault" train > "$out" 2>&1 &
    mpid=$!
    steps() { cat "$of"/*/rank.$1/stdout 2> /dev/null | grep -c "^rank $1: step [0-9]*$"; }
    t=$(now) r=0
    while [ "$r" -lt "$n" ] && kill -0 "$mpid" 2> /dev/null && [ "$(since "$t" | cut -d. -f1)" -lt 240 ]; do
        if [ "$(steps $r)" -ge 20 ]; then r=$((r + 1)); else sleep 0.1; fi
    done
    if [ "$r" -lt "$n" ]; then
        kill "$mpid" 2> /dev/null; wait "$mpid"
        cat "$out"; say "$n hosts, $mode: the ranks did not all reach step 20 within 240 s (a hang guard)"
        return 1
    fi
    step=$(steps $last)
    if [ "$mode" = kill ]; then
        pid=
        for q in $(ip netns pids "${p}n$n"); do [ "$(cat "/proc/$q/comm" 2> /dev/null)" = fault ] && pid=$q; done
        if [ -z "$pid" ]; then
            kill "$mpid" 2> /dev/null; wait "$mpid"
            cat "$out"; say "$n hosts, kill: no process \"fault\" in host $n's namespace"
            return 1
        fi
        t0=$(now)
        kill -9 "$pid"
    else
        t0=$(now)
        ip link set "${p}r$n" down
    fi
    # until mpirun ends: when each rank says nabla's timeout message
    want="no answer from the other ranks for 5 s (a rank died or stopped calling nb_ddp_sync, or the network between the ranks is down)"
    said= hostgone=
    while kill -0 "$mpid" 2> /dev/null; do
        [ -n "$hostgone" ] || [ -n "$(ip netns pids "${p}n$n")" ] || hostgone=$(since "$t0")
        r=0
        while [ "$r" -lt "$n" ]; do
            case " $said " in *" $r:"*) ;; *)
                grep -qF "$want" "$of"/*/rank.$r/stdout 2> /dev/null && said="$said $r:$(since "$t0")" ;;
            esac
            r=$((r + 1))
        done
        sleep 0.1
    done
    wait "$mpid"
    status=$? dt=$(since "$t0")
    # then until no process of the run is left in its namespaces (60 s at most: a hang guard)
    while [ -n "$(net_pids)" ] && [ "$(since "$t0" | cut -d. -f1)" -lt "$(( ${dt%.*} + 60 ))" ]; do
        [ -n "$hostgone" ] || [ -n "$(ip netns pids "${p}n$n")" ] || hostgone=$(since "$t0")
        sleep 0.1
    done
    left=$(net_pids | wc -l) gone=$(since "$t0")
    [ "$mode" = down ] && ip link set "${p}r$n" up
    if [ "$status" -eq 124 ]; then
        cat "$out"; say "$n hosts, $mode: mpirun hung (killed by timeout after 300 s)"; return 1
    fi
    if [ "$left" -ne 0 ]; then
        cat "$out"; say "$n hosts, $mode: $left processes of the run still alive $gone s after the fault"; return 1
    fi
    if [ "$mode" = kill ]; then
        msg="mpirun noticed that process rank $last with PID $pid on node $net.$n exited on signal 9 (Killed)."
        # or, now and then, a rank that wrote to the dead one's socket died
        # of SIGPIPE first and mpirun names that one; the killed rank's host
        # is then named by Open MPI's "peer hung up" message
        pipe=$(grep -o "mpirun noticed that process rank [0-9]* with PID [0-9]* on node [^ ]* exited on signal 13 (Broken pipe)." "$out")
        if [ "$status" -ne 0 ] && grep -qF "$msg" "$out"; then
            say "$n hosts: rank $last killed (SIGKILL to its pid in host $n's namespace) after $step steps:" \
                "mpirun ended in $dt s (exit $status): \"$msg\"; no process of the run left after $gone s"
        elif [ "$status" -ne 0 ] && [ -n "$pipe" ] && grep -q "Peer host: *$net.$n\$" "$out"; then
            say "$n hosts: rank $last killed (SIGKILL to its pid in host $n's namespace) after $step steps:" \
                "mpirun ended in $dt s (exit $status), naming a rank that died of SIGPIPE writing to it: \"$pipe\"" \
                "and Open MPI's \"peer hung up\" naming host $n ($net.$n); no process of the run left after $gone s"
        else
            cat "$out"; say "$n hosts, kill: exit $status after $dt s, expected nonzero and \"$msg\""
            return 1
        fi
    else
        # each rank's message, in the output file of its host's orted; how
        # many of them reached mpirun
        ok=1 r=0 seen=0
        while [ "$r" -lt "$n" ]; do
            line="^rank $r: step [0-9]*: nb_ddp_sync: rank $r: [^:]*: no answer from the other ranks for 5 s"
            grep "$line" "$of"/*/rank.$r/stdout 2> /dev/null | grep -qF "$want" || ok=0
            grep "$line" "$out" | grep -qF "$want" && seen=$((seen + 1))
            r=$((r + 1))
        done
        times=$(echo "$said" | tr ' ' '\n' | cut -s -d: -f2 | sort -n | sed -n '1p;$p' | paste -sd- | sed 's/^\([^-]*\)-\1$/\1/')
        if [ "$ok" -eq 1 ] && [ "$status" -ne 0 ]; then
            say "$n hosts: host $n's link down (bridge side) after $step steps: every rank said \"$want\"" \
                "after $times s ($seen of them reached mpirun's output: rank $last's orted cannot reach it);" \
                "host $n's orted exited by itself after ${hostgone:-$gone} s, mpirun after $dt s (exit $status);" \
                "no process of the run left after $gone s"
        else
            cat "$out"; for f in "$of"/*/rank.*/stdout; do grep -v 'step [0-9]*$' "$f"; done
            say "$n hosts, link down: exit $status after $dt s; expected every rank's \"$want\" and a nonzero exit"
            return 1
        fi
    fi
}

rc=0
from=
for n in "$@"; do
    if ! hosts "$n"; then
        say "could not set up $n hosts (network namespaces, veth, bridge, tbf)"
        rc=1
        break
    fi
    # 1
    out=$build/mpi/net-$n.log
    t0=$(date +%s)
    timeout 300 $mpirun $over -np "$n" "$(pwd)/$build/mpi/test_mpi" > "$out" 2>&1
    status=$?
    sent=$(ip -n "${p}n1" -s link show "${p}h1" | awk '/TX:/{getline; print $1}')
    if [ "$status" -eq 0 ] && grep -q "Failures: 0, Errors: 0" "$out"; then
        say "$n hosts over TCP (veth + bridge, tbf $rate): test_mpi passed in" \
            "$(($(date +%s) - t0)) s, host 1 sent $sent bytes ($(grep -m1 -o 'Checks: [0-9]*' "$out"))"
    else
        cat "$out"
        say "$n hosts: test_mpi failed (exit $status)"
        rc=1
    fi
    # 2
    timeout 300 $mpirun -np "$n" build-mpi/examples/gpt --dist $g --batch 2 --steps 4 \
        --save "$tmp/shm.ckpt" > "$tmp/shm.log" 2>&1 || { cat "$tmp/shm.log"; say "gpt on $n ranks over shared memory failed"; rc=1; }
    if gpt net "$n" $g --batch 2 --steps 4 --save "$tmp/net.ckpt" && cmp -s "$tmp/shm.ckpt" "$tmp/net.ckpt" &&
        [ "$(losses "$tmp/net.log" | wc -l)" -eq 4 ] && [ "$(losses "$tmp/shm.log")" = "$(losses "$tmp/net.log")" ]; then
        say "$n hosts: gpt --dist wrote the checkpoint of shared memory bit for bit" \
            "($(wc -c < "$tmp/net.ckpt") bytes) with the same 4 losses"
    else
        cat "$tmp/shm.log" "$tmp/net.log"
        say "$n hosts: gpt --dist over TCP differs from shared memory"
        rc=1
    fi
    # 3: the checkpoint of step 3 and the uninterrupted run on the first
    # count, resumed on the later ones; 8 rows a step in all
    if [ $((8 % n)) -ne 0 ]; then
        say "$n hosts: no resume check (8 rows a step do not split over $n hosts)"
    elif [ -z "$from" ]; then
        if gpt from6 "$n" $g --batch $((8 / n)) --steps 6 --zero && gpt from3 "$n" $g --batch $((8 / n)) --steps 3 --zero --save "$tmp/from3"; then
            from=$n
            grep '^step [456]:' "$tmp/from6.log" | cut -d'(' -f1 > "$tmp/from6.losses"
        else rc=1; fi
    else
        ok=1
        for z in "" --zero; do
            if gpt "on$n$z" "$n" $g --batch $((8 / n)) --steps 6 $z --load "$tmp/from3"; then
                l=$(grep '^step [456]:' "$tmp/on$n$z.log" | cut -d'(' -f1)
                if [ "$(wc -l < "$tmp/from6.losses")" -ne 3 ] || [ "$l" != "$(cat "$tmp/from6.losses")" ]; then
                    cat "$tmp/from6.losses"; echo "$l"
                    say "$n hosts: gpt${z:+ $z}: the step-3 checkpoint of $from hosts gives other losses"
                    ok=0
                fi
            else ok=0; fi
        done
        [ "$ok" -eq 1 ] || rc=1
        [ "$ok" -eq 0 ] || say "$n hosts: gpt --dist --zero's checkpoint of step 3 on $from hosts, resumed on $n hosts and on $n --zero" \
            "(8 rows a step): steps 4-6 $(awk '{printf "%s%s", s, $4; s=", "}' "$tmp/from6.losses"), as on $from hosts without a stop"
    fi
    # 4, 5
    if [ -x "$build/mpi/fault" ]; then
        fault "$n" kill || rc=1
        fault "$n" down || rc=1
    else
        say "$build/mpi/fault is missing"
        rc=1
    fi
    net_cleanup
done
left=$(net_left)
if [ "$left" -ne 0 ]; then
    say "$left namespaces, links or qdiscs of this run left behind"
    rc=1
else
    say "nothing left behind (no ${p}* namespace, link or qdisc)"
fi
exit $rc
