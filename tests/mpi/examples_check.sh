#!/bin/sh
# examples_check.sh BUILD "MPIRUN": make test-mpi's checks of the examples'
# --dist (BUILD holds the examples built with MPI, make MPI=1):
#   1. copy_task on 2 ranks reaches "exact match 100% (1000/1000)", and
#      its redirected output has no progress line ("\r", ESC);
#   2. copy_task on 2 ranks: 2 epochs, --load, 2 more = 4 epochs at once,
#      the same checkpoint bit for bit;
#   3. gpt on 2 ranks: --zero (sharded AdamW state) writes the checkpoint
#      plain --dist writes, bit for bit, and resumes from it bit for bit;
#      with evaluations and --save-best too;
#   4. gpt: a checkpoint of step 3 on 2 ranks resumed on 1 process, on 4
#      ranks, and on 4 ranks with --zero, with the same global batch (8
#      rows): steps 4-6 have the losses of the 2-rank run, to the 6 digits
#      printed (f32 rounding differs with the rank count);
#   5. a failed --load (every rank reads) and a failed --save (rank 0
#      writes, --zero gathers first) stop every rank with the failed rank's
#      message (the time is printed; a hang is stopped by timeout); --zero
#      without --dist is refused.
build=$1
mpirun=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
ex=$build/examples
say() { echo "test-mpi: $*"; }
die() { echo "test-mpi: FAILED: $*"; exit 1; }
export NABLA_NUM_THREADS=1

# 1
$mpirun -np 2 "$ex/copy_task" --dist > "$d/run.log" 2>&1
last=$(tail -1 "$d/run.log")
[ "$last" = "exact match 100% (1000/1000)" ] || { cat "$d/run.log"; die "copy_task --dist on 2 ranks ended on \"$last\""; }
say "mpirun -np 2 copy_task --dist: $last"
# no progress line in a log: mpirun gives each rank's stdout a terminal of
# its own (isatty says yes) even when its own output goes to a file
plain() { tr -d '\r\033' < "$1" | cmp -s - "$1"; }
plain "$d/run.log" || die "mpirun -np 2 copy_task --dist > log: the log has progress lines (\\r or ESC): $(od -c "$d/run.log" | grep -m1 '\\r\|033')"

# 2
for e in 4:straight 2:half 4:resumed; do
    n=${e%%:*}; f=${e##*:}
    load=$([ "$f" = resumed ] && echo "--load $d/half")
    $mpirun -np 2 "$ex/copy_task" --dist $RESUME_ARGS --epochs "$n" $load --save "$d/$f" \
        > "$d/$f.log" 2>&1 || { cat "$d/$f.log"; die "copy_task --dist --epochs $n $load"; }
done
cmp -s "$d/straight" "$d/resumed" || die "copy_task --dist: 2 + 2 epochs differ from 4"
say "copy_task --dist on 2 ranks, 2 epochs + --load + 2 = 4 epochs, checkpoints identical"

# 3
gpt() { # log-name np args...
    name=$1 np=$2; shift 2
    if [ "$np" = 1 ]; then "$ex/gpt" "$@" > "$d/$name.log" 2>&1
    else $mpirun -np "$np" "$ex/gpt" --dist "$@" > "$d/$name.log" 2>&1; fi ||
        { cat "$d/$name.log"; die "gpt on $np: $*"; }
}
g="--config tiny --seq 32 --dropout 0"
gpt plain6 2 $g --batch 4 --steps 6 --save "$d/plain6"
gpt zero6 2 $g --batch 4 --steps 6 --zero --save "$d/zero6"
gpt zero3 2 $g --batch 4 --steps 3 --zero --save "$d/zero3"
gpt zero36 2 $g --batch 4 --steps 6 --zero --load "$d/zero3" --save "$d/zero36"
cmp -s "$d/plain6" "$d/zero6" || die "gpt --zero wrote another checkpoint than plain --dist"
cmp -s "$d/zero6" "$d/zero36" || die "gpt --zero: 3 + 3 steps differ from 6"
say "gpt on 2 ranks: --zero's checkpoint is plain --dist's, and 3 + --load + 3 steps = 6, bit for bit"
# with evaluations (each rank scores its rows, the mean is the ranks') and --save-best
e="--val-split 0.1 --eval-interval 3 --eval-iters 2 --zero"
gpt eval6 2 $g --batch 4 --steps 6 $e --save "$d/eval6" --save-best "$d/best6"
gpt eval3 2 $g --batch 4 --steps 3 $e --save "$d/eval3" --save-best "$d/best36"
gpt eval36 2 $g --batch 4 --steps 6 $e --load "$d/eval3" --save "$d/eval36" --save-best "$d/best36"
grep -q '^step 6: train loss [0-9.]*, val loss [0-9.]*, lr ' "$d/eval6.log" || die "gpt --dist: no evaluation at step 6: $(cat "$d/eval6.log")"
cmp -s "$d/eval6" "$d/eval36" && cmp -s "$d/best6" "$d/best36" ||
    die "gpt --dist --zero with evaluations and --save-best: 3 + 3 steps differ from 6"
gpt best6 2 $g --batch 4 --steps 6 $e --save-best "$d/best6-alone" # rank 0 gathers for --save-best alone
cmp -s "$d/best6" "$d/best6-alone" || die "gpt --dist --zero --save-best without --save: another best checkpoint"
say "gpt on 2 ranks with evaluations and --save-best: 3 + --load + 3 steps = 6, checkpoints and best checkpoints identical"

# 4
losses() { grep '^step [456]:' "$d/$1.log" | cut -d'(' -f1; }
gpt on1 1 $g --batch 8 --steps 6 --load "$d/zero3"
gpt on4 4 $g --batch 2 --steps 6 --load "$d/zero3"
gpt on4zero 4 $g --batch 2 --steps 6 --zero --load "$d/zero3"
[ "$(losses zero6 | wc -l)" = 3 ] || die "gpt: no losses of steps 4-6 in the 2-rank run"
for r in on1 on4 on4zero; do
    [ "$(losses $r)" = "$(losses zero6)" ] ||
        { losses zero6; losses $r; die "gpt: the step-3 checkpoint resumed ($r) gives other losses"; }
done
say "gpt: a 2-rank --zero checkpoint resumed on 1 process, 4 ranks and 4 ranks --zero: steps 4-6 $(losses zero6 | awk '{printf "%s%s", s, $4; s=", "}')"

# 5
fails() { # expected message, np, example, args...
    want=$1 np=$2 prog=$3; shift 3
    t0=$(date +%s)
    timeout 300 $mpirun -np "$np" "$ex/$prog" --dist "$@" > "$d/fail.log" 2>&1 && die "$prog $* succeeded"
    dt=$(($(date +%s) - t0)) # printed, not judged: the timeout is a hang guard only
    n=$(grep -c -F -e "$want" "$d/fail.log")
    [ "$n" = "$np" ] ||
        { cat "$d/fail.log"; die "$prog $*: $n of $np ranks said \"$want\", after $dt s"; }
    say "$prog $* on $np ranks: every rank stopped with \"$want\" (${dt} s)"
}
fails "--load: rank 0 failed: nb_load: cannot open \"$d/none\"" 2 copy_task --load "$d/none"
fails "--save: rank 0 failed: --save: cannot write \"$d/no/x\": its folder \"$d/no\"" 4 gpt \
    $g --batch 2 --steps 2 --zero --save "$d/no/x"
"$ex/gpt" --zero > "$d/fail.log" 2>&1 && die "gpt --zero without --dist succeeded"
grep -q -F -e "gpt: --zero shards the optimizer over --dist's ranks: give --dist too" "$d/fail.log" ||
    { cat "$d/fail.log"; die "gpt --zero without --dist: no message"; }
say "gpt --zero without --dist: refused with a message"
