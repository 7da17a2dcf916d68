#!/bin/sh
# fault_check.sh BUILD "MPIRUN" NP...: the fault cases of make test-mpi, with
# tests/mpi/fault.c on each rank count:
#   kill    one rank is killed (SIGKILL) in the middle of training: the job
#           must end, nonzero, with mpirun's message naming the rank and the
#           signal;
#   silent  one rank stops taking part (it sleeps): every other rank must
#           stop with nabla's timeout message (NABLA_MPI_TIMEOUT=5 here; 20 s
#           by default), nonzero.
# The time each took is printed, not judged: `timeout 300` guards against a
# hang only (exit 124), so a loaded machine cannot fail the check.
build=$1
mpirun=$2
shift 2
rc=0
for np in "$@"; do
    for mode in kill silent; do
        out=$build/mpi/fault-$mode-$np.log
        t0=$(date +%s)
        NABLA_MPI_TIMEOUT=5 NABLA_NUM_THREADS=1 timeout 300 $mpirun -np "$np" "$build/mpi/fault" "$mode" \
            > "$out" 2>&1
        status=$?
        dt=$(($(date +%s) - t0))
        case $mode in
        kill) want="exited on signal 9" ;;
        silent) want="no answer from the other ranks for 5 s (a rank died or stopped calling nb_ddp_sync, or the network between the ranks is down)" ;;
        esac
        if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && grep -qF "$want" "$out"; then
            echo "fault-check: $np ranks, $mode: stopped in ${dt} s (exit $status): $(grep -m1 -F "$want" "$out" | sed 's/^ *//')"
        else
            cat "$out"
            echo "fault-check: $np ranks, $mode: exit $status after ${dt} s (124: a hang, stopped by timeout), expected a nonzero exit and \"$want\""
            rc=1
        fi
    done
done
exit $rc
