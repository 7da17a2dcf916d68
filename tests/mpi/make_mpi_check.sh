#!/bin/sh
# make_mpi_check.sh MAKE BUILD: what make mpi leaves and says (make test-mpi
# runs it after make mpi):
#   1. the top-level libnabla.a and libnabla.so still point at build/, as
#      README.md says (make mpi builds build-mpi/ beside it);
#   2. the mpirun command make mpi prints runs here as it is (as root, Open
#      MPI refuses a plain "mpirun -np 2"), with a short copy_task appended.
make=$1
build=$2
say() { echo "make-mpi-check: $*"; }
die() { echo "make-mpi-check: FAILED: $*"; exit 1; }

if [ "$build" = build ]; then
    for l in libnabla.a libnabla.so; do
        t=$(readlink "$l")
        [ "$t" = "build/$l" ] || die "$l points at \"$t\" after make mpi; README.md says build/$l"
    done
fi
out=$($make --no-print-directory mpi 2>&1) || die "make mpi: $out"
cmd=$(printf '%s\n' "$out" | sed -n 's/^    \(mpirun .*\)$/\1/p' | head -n 1)
[ -n "$cmd" ] || die "make mpi printed no mpirun command: $out"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
NABLA_NUM_THREADS=1 timeout 300 $cmd --epochs 1 --batches 3 --d-model 32 --d-ff 64 --check 10 \
    > "$log" 2>&1 || die "make mpi's command does not run here: $cmd: $(head -n 5 "$log")"
say "the links point at build/; make mpi's command runs here: $cmd"
