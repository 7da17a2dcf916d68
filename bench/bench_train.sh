#!/bin/sh
# bench_train.sh BUILD: make bench-train, a time-to-loss benchmark.
#
# nanoGPT's CPU recipe (its README's small character-level run: block_size 64,
# batch 12, 4 layers, 4 heads, n_embd 128, dropout 0, bias False, 2000 steps,
# lr 1e-3 with 100 warmup steps and a cosine decay to 1e-4 at step 2000, AdamW
# betas (0.9, 0.99), weight decay 0.1 on the >= 2-D parameters, clip 1.0) on
# the bytes of examples/data/kjv.txt (train: the first 90%, validation: the
# last 10%), trained by nabla (BUILD/examples/gpt) and by PyTorch
# (bench/torch_gpt_train.py: the same model, nabla's nb_GPT with GELU tanh,
# and the same recipe). Each row: ms/step (median of the "(Y ms)" of the step
# lines), the training time (the sum of the step times: batch, forward,
# backward, clipping, AdamW; no evaluation inside, both systems alike), the
# validation loss over all 64-byte windows of the validation part, and the
# ratio of the training time to PyTorch f32's on the same thread count.
#
# Variables:
#   BENCH_TRAIN_STEPS  steps per run (2000); e.g. 100 for a quick look
#   BENCH_TRAIN_ROWS   rows to run, of: nabla-f32-1 nabla-f32-2 nabla-bf16-1
#                      nabla-bf16-2 torch-f32-1 torch-f32-2 torch-bf16-1
#                      torch-bf16-2 (default: all but torch-bf16-2)
#   BENCH_TRAIN_TORCH  auto (default: live PyTorch when /usr/bin/python3 imports
#                      torch, else the rows recorded in bench/torch_results.txt),
#                      live, recorded, none
#   BENCH_TRAIN_RECORD 1: write the live PyTorch rows into bench/torch_results.txt
#                      (gpttrain_* keys; only for the default 2000 steps)
#   BENCH_TRAIN_PEAK   the f32 1-thread peak in GFLOP/s for the bound (default:
#                      measured now by BUILD/bench/bench 1, low on a busy machine)
#   BENCH_TRAIN_PROBE  steps of each of PyTorch's three 2-thread configurations
#                      tried before its 2-thread rows (30): OpenBLAS 1 or 2 threads,
#                      OMP_WAIT_POLICY=passive or libgomp's spinning default
#   BENCH_TRAIN_REUSE  1: rows whose logs in BUILD/bench-train are complete for
#                      these steps are read, not run again (an interrupted run)
#   BENCH_TRAIN_PYTHON the Python with torch (/usr/bin/python3)
#   BENCH_TRAIN_LOG    the logs' directory (BUILD/bench-train)
build=${1:-build}
steps=${BENCH_TRAIN_STEPS:-2000}
rows=${BENCH_TRAIN_ROWS:-"nabla-f32-1 nabla-f32-2 nabla-bf16-1 nabla-bf16-2 torch-f32-1 torch-f32-2 torch-bf16-1"}
torch_mode=${BENCH_TRAIN_TORCH:-auto}
probe=${BENCH_TRAIN_PROBE:-30}
py=${BENCH_TRAIN_PYTHON:-/usr/bin/python3}
data=examples/data/kjv.txt
results=bench/torch_results.txt
log=${BENCH_TRAIN_LOG:-$build/bench-train}
gpt=$build/examples/gpt
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread
mkdir -p "$log"
: > "$log/rows"

die() { echo "bench-train: $*" >&2; exit 1; }
case $steps in '' | *[!0-9]*) die "BENCH_TRAIN_STEPS must be a number of steps, got \"$steps\"" ;; esac
[ "$steps" -gt 0 ] || die "BENCH_TRAIN_STEPS must be at least 1"
for r in $rows; do
    case $r in nabla-f32-[12] | nabla-bf16-[12] | torch-f32-[12] | torch-bf16-[12]) ;;
    *) die "BENCH_TRAIN_ROWS: unknown row \"$r\" (rows: nabla-f32-1 nabla-f32-2 nabla-bf16-1 nabla-bf16-2 torch-f32-1 torch-f32-2 torch-bf16-1 torch-bf16-2)" ;;
    esac
done
reuse() { [ "${BENCH_TRAIN_REUSE:-0}" = 1 ]; }
wants() { case " $rows " in *" $1 "*) return 0 ;; esac; return 1; }
wants_torch() { case " $rows " in *" torch-"*) return 0 ;; esac; return 1; }

# ------------------------------------------------------------- the machine
cpu_field() { awk -F': *' -v k="$1" '$1 ~ "^" k "[ \t]*$" {print $2; exit}' /proc/cpuinfo; }
cpu_model=$(cpu_field "model name")
cpu_family=$(cpu_field "cpu family")
cpu_modelno=$(cpu_field "model")
cpu_flags=$(cpu_field "flags" | tr ' ' '\n' | grep -E '^(avx512|amx)|bf16' | tr '\n' ' ' | sed 's/ $//')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

echo "make bench-train: $(date -u '+%Y-%m-%d %H:%M UTC'), $steps steps per run"
echo "cpu      ${cpu_model:-unknown} (family ${cpu_family:--}, model ${cpu_modelno:--}), $(nproc) online CPU(s)"
echo "flags    ${cpu_flags:-(no avx512, bf16 or amx flag)}"
echo "load     $load_before (1, 5, 15 min) at the start"

# --------------------------------------------------------------- the bound
# Matrix-product FLOPs of one step (what both systems compute; the causal
# attention products are computed in full, masked after): per token and
# layer 24 C^2 (c_attn 6, attn c_proj 2, c_fc 8, mlp c_proj 8) + 4 T C (q k^T
# and att v), lm_head 2 C V; backward twice the forward.
flops=$(awk 'BEGIN {B = 12; T = 64; L = 4; C = 128; V = 256
    printf "%.0f", 3 * B * T * (L * (24 * C * C + 4 * T * C) + 2 * C * V)}')
peak1=${BENCH_TRAIN_PEAK:-}
peak2="" peakb1="" peak_note="measured now by $build/bench/bench 1"
if [ -z "$peak1" ] && [ -x "$build/bench/bench" ]; then
    "$build/bench/bench" 1 > "$log/peak.txt" 2>&1
    # the line above "(the peak for %pk ratios ...)" and the vdpbf16ps one: "<name> chains 1t Nt"
    set -- $(awk '/the peak for %pk/ {print p} {p = $0}' "$log/peak.txt" |
        awk '{for (i = 1; i < NF; i++) if ($i == "chains") print $(i + 1), $(i + 2)}')
    peak1=${1:-} peak2=${2:-}
    set -- $(awk '/vdpbf16ps chains/ {for (i = 1; i < NF; i++) if ($i == "chains") print $(i + 1), $(i + 2)}' "$log/peak.txt")
    peakb1=${1:-}
elif [ -n "$peak1" ]; then
    peak_note="BENCH_TRAIN_PEAK"
fi
awk -v f="$flops" -v p1="$peak1" -v p2="$peak2" -v pb="$peakb1" -v s="$steps" -v note="$peak_note" 'BEGIN {
    printf "work     %.3f GFLOP per step in matrix products (12 x 64 tokens; 3 x the forward'"'"'s)\n", f / 1e9
    if (p1 != "") {
        printf "bound    at the f32 1-thread peak %s GFLOP/s (%s): %.1f ms/step, %.1f s for %d steps\n", p1, note, f / p1 / 1e6, f / p1 / 1e9 * s, s
        if (p2 != "") printf "         at the f32 2-thread peak %s GFLOP/s: %.1f ms/step", p2, f / p2 / 1e6
        if (pb != "") printf "; bf16 products at the 1-thread bf16 peak %s GFLOP/s: %.1f ms/step", pb, f / pb / 1e6
        if (p2 != "" || pb != "") printf "\n"
    } else print "bound    - (no peak: build " "'"$build"'" "/bench/bench, or set BENCH_TRAIN_PEAK)"
}'

# --------------------------------------------------------------- the runs
# median and sum of the "step N: loss X (Y ms)" lines of a log
step_stats() {
    awk '$1 == "step" && $3 == "loss" && $6 ~ /^ms\)/ {v = $5; sub(/\(/, "", v); print v}' "$1" |
        sort -n | awk '{v[NR] = $1; s += $1} END {if (NR) printf "%s %.2f\n", v[int((NR + 1) / 2)], s / 1000; else print "- -"}'
}
# row SYSTEM DTYPE THREADS MS_MEDIAN TRAIN_S VAL_LOSS STEPS NOTE
add_row() { echo "$*" >> "$log/rows"; }

nabla_row() { # dtype threads
    d=$1 k=$2 name=nabla-$1-$2
    [ -x "$gpt" ] || die "$gpt is not built"
    rm -f "$log/$name.ckpt"
    if reuse && grep -q "^saved .* (step $steps)" "$log/$name.log" 2> /dev/null &&
        grep -q '^loss ' "$log/$name.eval" 2> /dev/null; then
        add_row nabla "$d" "$k" $(step_stats "$log/$name.log") \
            "$(awk '$1 == "loss" {v = $2} END {print v}' "$log/$name.eval")" "$steps" "reused"
        return
    fi
    # no evaluation during training: one, of one batch, at the last step only
    "$gpt" --config char --no-bias --data "$data" --val-split 0.1 --shuffle --batch 12 --seq 64 \
        --steps "$steps" --lr 1e-3 --lr-schedule cosine --min-lr 1e-4 --lr-decay-steps 2000 \
        --warmup 100 --beta2 0.99 --weight-decay 0.1 --decay-groups 2d --clip 1 \
        --eval-interval "$steps" --eval-iters 1 --dtype "$d" --threads "$k" \
        --save "$log/$name.ckpt" > "$log/$name.log" 2>&1 ||
        { tail -20 "$log/$name.log"; die "nabla $d $k threads: training failed (log: $log/$name.log)"; }
    "$gpt" --config char --no-bias --load "$log/$name.ckpt" --eval --data "$data" --val-split 0.1 --batch 64 --seq 64 --dtype "$d" \
        --threads "$k" > "$log/$name.eval" 2>&1 ||
        { tail -20 "$log/$name.eval"; die "nabla $d $k threads: evaluation failed (log: $log/$name.eval)"; }
    # the last number after "loss" on the evaluation's lines
    val=$(awk '{for (i = 1; i < NF; i++) if ($i ~ /^loss:?$/) v = $(i + 1)} END {print v == "" ? "-" : v}' "$log/$name.eval")
    add_row nabla "$d" "$k" $(step_stats "$log/$name.log") "$val" "$steps" "-"
}

torch_ok=0
if wants_torch; then
    case $torch_mode in
    auto | live)
        if "$py" -c 'import torch' 2> /dev/null; then torch_ok=1
        elif [ "$torch_mode" = live ]; then die "BENCH_TRAIN_TORCH=live: $py cannot import torch"
        fi ;;
    recorded | none) ;;
    *) die "BENCH_TRAIN_TORCH must be auto, live, recorded or none, got \"$torch_mode\"" ;;
    esac
fi
# torch_run NAME OPENBLAS_THREADS ARGS...: bench/torch_gpt_train.py on OpenBLAS
# when libopenblas0-pthread is installed (as bench/torch_bench.py), else on
# the BLAS that libblas.so.3 selects
torch_run() {
    tr_log=$log/$1.log tr_obt=$2 tr_wait=$3
    shift 3
    if [ -d "$openblas" ]; then
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ${tr_wait:+OMP_WAIT_POLICY=$tr_wait} \
            LD_LIBRARY_PATH="$openblas" OPENBLAS_NUM_THREADS="$tr_obt" \
            "$py" bench/torch_gpt_train.py --data "$data" "$@"
    else
        env ${tr_wait:+OMP_WAIT_POLICY=$tr_wait} OPENBLAS_NUM_THREADS="$tr_obt" \
            "$py" bench/torch_gpt_train.py --data "$data" "$@"
    fi > "$tr_log" 2>&1 || { tail -20 "$tr_log"; die "PyTorch failed (log: $tr_log)"; }
}
result_field() { awk -v k="$2" '$1 == "result" {for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2)}' "$1"; }
ln_bias=1 # nn/gpt.c's layer norms keep their bias with bias false; the checkpoint tells
torch_row() { # dtype threads
    d=$1 k=$2 name=torch-$1-$2 obt=1 wait="" note="torch threads $2, OpenBLAS 1"
    if reuse && grep -q "^result torch $d threads=$k steps=$steps " "$log/$name.log" 2> /dev/null &&
        [ -s "$log/$name.note" ]; then
        note="$(cat "$log/$name.note"); reused from an earlier run"
    else
        if [ "$k" = 2 ]; then
            # torch's 2 threads over 1-thread OpenBLAS, or OpenBLAS's own 2 threads;
            # libgomp's threads waiting passively, or spinning (its default): on a
            # busy machine the spinning ones have taken 30 times as long
            p=$probe best="" bm=""
            [ "$p" -gt "$steps" ] && p=$steps
            probes=""
            for c in 1:passive 2:passive 1:; do
                o=${c%%:*} w=${c#*:}
                torch_run "$name-probe" "$o" "$w" --quiet --steps "$p" --threads 2 --dtype "$d" --ln-bias "$ln_bias"
                m=$(result_field "$log/$name-probe.log" ms_median)
                probes="$probes${probes:+, }OpenBLAS $o ${w:-spinning} $m ms"
                if [ -z "$bm" ] || awk -v a="$m" -v b="$bm" 'BEGIN {exit !(a < b)}'; then best=$c bm=$m; fi
            done
            obt=${best%%:*} wait=${best#*:}
            note="torch threads 2, OpenBLAS $obt, OMP_WAIT_POLICY ${wait:-unset (spinning)} (probe of $p steps: $probes)"
        fi
        torch_run "$name" "$obt" "$wait" --steps "$steps" --threads "$k" --dtype "$d" --ln-bias "$ln_bias"
    fi
    add_row torch "$d" "$k" "$(result_field "$log/$name.log" ms_median)" \
        "$(result_field "$log/$name.log" train_s)" "$(result_field "$log/$name.log" val_loss)" \
        "$steps" "$note"
    echo "$note" > "$log/$name.note"
}

for r in $rows; do
    case $r in nabla-*) set -- $(echo "$r" | tr '-' ' '); nabla_row "$2" "$3" ;; esac
done
for f in "$log"/nabla-*.ckpt; do # the layer norms' bias: as the model nabla trained
    [ -e "$f" ] || continue
    head -c 65536 "$f" | grep -q 'ln_1\.bias' && ln_bias=1 || ln_bias=0
    break
done

torch_source=""
if wants_torch && [ "$torch_ok" = 1 ]; then
    for r in $rows; do
        case $r in torch-*) set -- $(echo "$r" | tr '-' ' '); torch_row "$2" "$3" ;; esac
    done
    blas=$(awk '$1 == "blas" {sub(/^blas /, ""); print; exit}' "$log"/torch-*.log 2> /dev/null)
    torch_source="live: torch $("$py" -c 'import torch; print(torch.__version__)'), BLAS ${blas:-?}"
elif wants_torch && [ "$torch_mode" != none ]; then
    # the rows recorded by BENCH_TRAIN_RECORD=1: gpttrain_<dtype>_<T>t_{ms,s,val,steps}
    for r in $rows; do
        case $r in torch-*) ;; *) continue ;; esac
        set -- $(echo "$r" | tr '-' ' ')
        k=gpttrain_$2_$3t
        line=$(awk -v k="$k" '$1 == k "_ms" {ms = $2} $1 == k "_s" {s = $2} $1 == k "_val" {v = $2}
            $1 == k "_steps" {n = $2} $1 == k "_openblas_threads" {o = $2}
            END {if (ms != "") print ms, s, v, n, (o == "" ? 1 : o)}' "$results" 2> /dev/null)
        [ -n "$line" ] || continue
        set -- torch "$2" "$3" $line
        add_row "$1" "$2" "$3" "$4" "$5" "$6" "$7" "recorded, torch threads $3, OpenBLAS $8"
    done
    grep -q '^torch ' "$log/rows" || echo "pytorch  no recorded row in $results for these rows (BENCH_TRAIN_RECORD=1 with live PyTorch writes them)"
    torch_source="recorded in $results (no live PyTorch: $py cannot import torch, or BENCH_TRAIN_TORCH=$torch_mode): $(head -1 "$results" 2> /dev/null | tr ';' '\n' | grep 'gpttrain_\* keys' | sed 's/^ *//')"
fi

# ---------------------------------------------------------------- the table
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load     $load_after (1, 5, 15 min) at the end"
[ -n "$torch_source" ] && echo "pytorch  $torch_source"
echo
echo "nanoGPT's CPU recipe on kjv.txt's bytes (90/10): B=12, T=64, 4 layers, 4 heads, n_embd 128, no bias, AdamW"
echo "time: sum of the step times (batch, forward, backward, clip, AdamW); val: mean cross-entropy of all"
echo "validation windows of 64 bytes; ratio: training time / PyTorch f32's on the same threads (mean step time"
echo "when the step counts differ); GFLOP/s: the step's matrix-product FLOPs / its mean time"
printf "%-7s %-6s %7s %9s %10s %9s %7s %8s\n" system dtype threads "ms/step" "time (s)" "val loss" ratio "GFLOP/s"
awk -v f="$flops" -v p1="$peak1" -v p2="$peak2" '
    function num(v, d) {return v ~ /^[0-9.]+$/ ? sprintf("%." d "f", v) : "-"}
    {sys[NR] = $1; dt[NR] = $2; th[NR] = $3; ms[NR] = $4; s[NR] = $5; val[NR] = $6; n[NR] = $7
     if ($1 == "torch" && $2 == "f32" && $5 != "-" && $5 != "") {ref[$3] = $5 / $7; rval[$3] = $6}}
    END {for (i = 1; i <= NR; i++) {
        mean = (s[i] != "-" && s[i] != "") ? s[i] / n[i] : ""
        r = (mean != "" && ref[th[i]] > 0) ? sprintf("%.2f", mean / ref[th[i]]) : "-"
        g = mean != "" ? sprintf("%.1f", f / mean / 1e9) : "-"
        printf "%-7s %-6s %7s %9s %10s %9s %7s %8s%s\n", sys[i], dt[i], th[i], num(ms[i], 1), num(s[i], 1),
            num(val[i], 4), r, g,
            n[i] != "'"$steps"'" ? "  (" n[i] " steps)" : ""
    }
    # the goal: at most 0.6x PyTorch f32'"'"'s time on 1 thread, 0.5x on 2, val loss within 0.02
    for (i = 1; i <= NR; i++) {
        if (sys[i] != "nabla" || !(ref[th[i]] > 0) || s[i] == "-" || s[i] == "") continue
        if (!hdr++) print "goal: nabla at most 0.6x PyTorch f32'"'"'s training time on 1 thread, 0.5x on 2, validation loss within 0.02 of it"
        goal = th[i] == 1 ? 0.6 : 0.5; r = s[i] / n[i] / ref[th[i]]
        d = (val[i] ~ /^[0-9.]+$/ && rval[th[i]] ~ /^[0-9.]+$/) ? val[i] - rval[th[i]] : ""
        printf "  nabla %-4s %s thread(s): time %.2fx (goal %.1fx: %s), val loss %s (%s)\n", dt[i], th[i], r, goal,
            r <= goal ? "met" : "not met", d == "" ? "-" : sprintf("%+.4f", d),
            d == "" ? "-" : (d <= 0.02 && d >= -0.02) ? "within 0.02" : "not within 0.02"
    }
    if (hdr && p1 != "" && ref[1] > 0)
        printf "  the f32 bound (all products at the 1-thread f32 peak %s GFLOP/s) is %.2fx PyTorch f32'"'"'s 1-thread time\n", p1, f / p1 / 1e9 / ref[1]
    if (hdr && p2 != "" && ref[2] > 0)
        printf "  the f32 bound at the 2-thread peak %s GFLOP/s is %.2fx PyTorch f32'"'"'s 2-thread time\n", p2, f / p2 / 1e9 / ref[2]
    }' "$log/rows"
awk '$1 == "torch" {n = $0; for (i = 1; i <= 7; i++) sub(/^[^ ]+ /, "", n); printf "torch %s %s thread(s): %s\n", $2, $3, n}
    $1 == "nabla" && $8 == "reused" {printf "nabla %s %s thread(s): reused from an earlier run (BENCH_TRAIN_REUSE=1)\n", $2, $3}' "$log/rows"
echo
echo "logs in $log; the command: make bench-train (BENCH_TRAIN_STEPS=$steps BENCH_TRAIN_ROWS=\"$rows\")"

# ------------------------------------------------------------ the record
if [ "${BENCH_TRAIN_RECORD:-0}" = 1 ]; then
    if [ "$torch_ok" != 1 ] || [ "$steps" != 2000 ]; then
        echo "BENCH_TRAIN_RECORD=1: records live PyTorch rows of 2000 steps only; $results unchanged"
    elif [ -f "$results" ] && grep -q '^torch ' "$log/rows"; then
        part="gpttrain_* keys $(date -u +%Y-%m-%d) by make bench-train ($steps steps, sum of step times), ${cpu_model} (family $cpu_family, model $cpu_modelno), load average $load_before before, $load_after after"
        {
            head -1 "$results" | awk -v part="$part" '{n = split($0, p, "; "); out = ""
                for (i = 1; i <= n; i++) if (p[i] !~ /^gpttrain_\* keys/) out = out (out == "" ? "" : "; ") p[i]
                print out "; " part}'
            tail -n +2 "$results" | grep -v '^gpttrain_'
            awk '$1 == "torch" {k = "gpttrain_" $2 "_" $3 "t"; o = 1
                if (match($0, /OpenBLAS [0-9]+/)) o = substr($0, RSTART + 9, RLENGTH - 9)
                print k "_ms", $4; print k "_s", $5; print k "_val", $6; print k "_steps", $7
                print k "_openblas_threads", o}' "$log/rows"
        } > "$log/torch_results.new" && mv "$log/torch_results.new" "$results"
        echo "recorded the PyTorch rows in $results (gpttrain_* keys)"
    fi
fi
