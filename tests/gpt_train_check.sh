#!/bin/sh
# gpt_train_check.sh BUILD: examples/gpt's nanoGPT flags, each by a value it
# must give, on the tiny config (seconds in all). Run by make test.
# - --eval: the mean over every target of the file cut into windows of T
#   (the two batches' means weighted by their windows), --eval-iters 1 the
#   first batch, --val-split's part scored as the file of that part alone;
# - --val FILE and --val-split F: the same split gives the same lines;
#   nanoGPT's int(n * 0.9) tokens train; evaluations at step 0, every
#   --eval-interval and the last, lines that tools reading "step N: loss"
#   do not take; evaluations leave training's lines unchanged;
# - --lr-schedule cosine, linear, constant: the rate printed at each
#   evaluation is the formula's (nanoGPT's get_lr);
# - --save-best: saved exactly at each new lowest val loss (not at the
#   others), and the file resumes at that step, and evaluates without
#   --save-best;
# - --grad-accum 2 --batch 6: the losses and gradients (AdamW's exp_avg
#   after a step) of --batch 12, to 1e-5 and 1e-4 relative (not bit for
#   bit: the gradient is summed in another order);
# - --beta1 --beta2: AdamW's moments after one step, exp_avg^2 / exp_avg_sq
#   = (1 - beta1)^2 / (1 - beta2) in the checkpoint;
# - --decay-groups 2d decays wpe (a row no position of the batch reaches:
#   no gradient) by 1 - lr wd, linear leaves it;
# - --no-bias: no linear bias in the checkpoint, Hugging Face export and
#   back samples the same text, llm.c's export refused;
# - every refusal's message.
set -u
b=${1:-build}
gpt=$b/examples/gpt
d=$b/gpt-train-check
fails=0
bad() { echo "gpt-train-check: FAIL: $*"; fails=$((fails + 1)); }
rm -rf "$d" && mkdir -p "$d"
g() { "$gpt" --config tiny --seq 16 --threads 1 "$@"; }
# close A B TOL: |A - B| <= TOL
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }
# f32 FILE NAME I: element I of the F32 tensor NAME of a safetensors file
f32() {
    n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    off=$(head -c $((8 + n)) "$1" | tail -c "$n" |
        sed -n "s/.*\"$2\":{\"dtype\":\"F32\",\"shape\":\[[0-9,]*\],\"data_offsets\":\[\([0-9]*\),.*/\1/p")
    [ -n "$off" ] && od -An -tf4 -j $((8 + n + off + 4 * $3)) -N4 "$1" | tr -d ' '
}
strip() { sed 's/ ([0-9.]* ms)$//'; } # a run's lines without times

# --eval over the file: 100 bytes, T 16: 6 windows, batches of 4 and 2
head -c 100 examples/data/kjv.txt > "$d/t100"
tail -c +65 "$d/t100" > "$d/t36" # windows 4 and 5 of t100: bytes 64..99
all=$(g --data "$d/t100" --batch 4 --eval 2> "$d/err" | awk '$1 == "loss" {print $2}')
grep -q "^gpt: --eval: 6 windows of 16 tokens (96 targets) in 2 batch(es), from --data$" "$d/err" ||
    bad "--eval on 100 bytes: $(cat "$d/err")"
first=$(g --data "$d/t100" --batch 4 --eval --eval-iters 1 2> /dev/null | awk '$1 == "loss" {print $2}')
rest=$(g --data "$d/t36" --batch 2 --eval 2> /dev/null | awk '$1 == "loss" {print $2}')
want=$(awk -v a="$first" -v b="$rest" 'BEGIN {printf "%.6f", (4 * a + 2 * b) / 6}')
close "$all" "$want" 2e-6 || bad "--eval: $all over 6 windows, not (4 x $first + 2 x $rest) / 6 = $want"
# step 1 of training reads the first batch in file order, as --eval-iters 1
s1=$(g --data "$d/t100" --batch 4 --steps 1 | sed -n 's/^step 1: loss \([0-9.]*\) .*/\1/p')
[ "$s1" = "$first" ] || bad "--eval --eval-iters 1: $first, step 1's loss on the same batch $s1"
tail -c 50 "$d/t100" > "$d/t50"
a=$(g --data "$d/t100" --val-split 0.5 --batch 2 --eval 2> "$d/err")
[ "$a" = "$(g --data "$d/t50" --batch 2 --eval 2> /dev/null)" ] && [ -n "$a" ] ||
    bad "--eval --val-split 0.5: \"$a\", not the loss of the last 50 bytes alone"
grep -q "3 windows .* from the validation part of --data$" "$d/err" || bad "--eval --val-split: $(cat "$d/err")"

# --val FILE and --val-split F on the same split print the same lines
head -c 400 examples/data/kjv.txt > "$d/t400"
head -c 200 "$d/t400" > "$d/first"
tail -c 200 "$d/t400" > "$d/last"
ev="--batch 2 --steps 5 --shuffle --eval-interval 2 --eval-iters 3"
g --data "$d/t400" --val-split 0.5 $ev > "$d/split" || bad "--val-split 0.5: exit status $?"
g --data "$d/first" --val "$d/last" $ev > "$d/val" || bad "--val: exit status $?"
grep -q "^eval: every 2 steps, 3 batches of 2 x 16 tokens per split; train 200 tokens, val 200 tokens (the last 0.5 of --data)$" "$d/split" ||
    bad "--val-split 0.5: no eval settings line: $(grep eval: "$d/split")"
[ "$(grep '^step' "$d/split" | strip)" = "$(grep '^step' "$d/val" | strip)" ] ||
    bad "--val-split 0.5 and --val (the same halves) differ: $(diff "$d/split" "$d/val" | head -4)"
# evaluations at 0, 2, 4 and the last step (5); "step N: loss" lines only for steps
[ "$(grep -c '^step [0-9]*: loss ' "$d/split")" -eq 5 ] || bad "--eval-interval: step lines: $(cat "$d/split")"
[ "$(sed -n 's/^step \([0-9]*\): train loss [0-9.]*, val loss [0-9.]*, lr [0-9.e-]* ([0-9.]* ms)$/\1/p' "$d/split" | tr '\n' ' ')" = "0 2 4 5 " ] ||
    bad "--eval-interval 2 --steps 5: evaluations not at steps 0 2 4 5: $(grep 'train loss' "$d/split")"
# evaluations touch no training stream: the step lines of a run without them
[ "$(grep '^step [0-9]*: loss' "$d/split" | strip)" = "$(g --data "$d/first" --batch 2 --steps 5 --shuffle | grep '^step' | strip)" ] ||
    bad "evaluations changed training's steps"
# nanoGPT's split of n tokens: int(n * 0.9) train
g --val-split 0.1 --batch 2 --steps 1 --eval-iters 1 > "$d/kjv" 2>&1
grep -q "train 750159 tokens, val 83351 tokens (the last 0.1 of --data)" "$d/kjv" || bad "--val-split 0.1 of 833510 tokens: $(grep eval: "$d/kjv")"
# --eval-interval without a validation set: the train loss alone
out=$(g --batch 2 --steps 2 --eval-interval 2 --eval-iters 1 | grep "train loss" | strip | sed 's/[0-9]\.[0-9]*/X/g')
[ "$out" = "$(printf 'step 0: train loss X, lr X\nstep 2: train loss X, lr X')" ] || bad "--eval-interval alone: \"$out\""

# the rate at each step (printed by the evaluation before it) is the formula's
for s in cosine linear constant; do
    extra="--lr-schedule $s --min-lr 0.001 --lr-decay-steps 6"
    [ $s = constant ] && extra=
    g --batch 2 --steps 8 --eval-interval 1 --eval-iters 1 --lr 0.01 --warmup 2 $extra > "$d/lr" || bad "--lr-schedule $s: exit status $?"
    sed -n 's/^step \([0-9]*\): train loss .*, lr \([0-9.e-]*\) .*/\1 \2/p' "$d/lr" | awk -v s=$s '
        { i = $1; if (i < 2) w = 0.01 * (i + 1) / 3
          else if (s == "constant") w = 0.01
          else if (i > 6) w = 0.001
          else if (s == "cosine") w = 0.001 + 0.5 * (1 + cos(3.141592653589793 * (i - 2) / 4)) * 0.009
          else w = 0.01 + (0.001 - 0.01) * (i - 2) / 4
          r = ($2 - w) / w; if (r < 0) r = -r
          if (r > 1e-5) { printf "step %d: lr %s, expected %.6g; ", i, $2, w; bad = 1 } n++ }
        END { exit bad || n != 9 }' > "$d/why" || bad "--lr-schedule $s: $(cat "$d/why") ($(grep -c 'lr ' "$d/lr") rates)"
done

# --save-best: a save at each new lowest val loss, and the file resumes there
# (lr 0.03: the val loss goes up as well as down, 5 saves in 13 evaluations)
sb="--batch 2 --shuffle --val-split 0.1 --eval-interval 1 --eval-iters 2 --lr 0.03 --warmup 0"
g $sb --steps 12 --save-best "$d/best" > "$d/sb" ||
    bad "--save-best: exit status $?"
awk -v f="$d/best" 'BEGIN { best = 1e9 }
    / train loss / { if (due) bad = 1; split($0, p, /val loss |, lr /); s = $2; sub(/:/, "", s)
                     due = p[2] + 0 < best; if (due) { best = p[2] + 0; want = s }; next }
    /^saved / { if (!due || $0 != "saved " f " (step " want "): the lowest val loss so far") bad = 1
                due = 0; last = want; n++ }
    END { print last; exit bad || due || n != 5 }' "$d/sb" > "$d/last" ||
    bad "--save-best: saves not at the new lowest val losses: $(cat "$d/sb")"
last=$(cat "$d/last")
out=$(g $sb --steps 13 --save-best "$d/best2" --load "$d/best" | head -5)
case "$out" in *"resumed from $d/best: $last steps done"*) ;; *) bad "--load of --save-best's file (saved at step $last): $out" ;; esac
# the best checkpoint (it holds the lowest loss too) evaluates without --save-best, and an
# --eval of it with --val-split scores the validation part: --eval-iters 2 val batches
out=$(g --batch 2 --load "$d/best" --eval --val-split 0.1 --eval-iters 2 2>&1)
case "$out" in *"loss "[0-9]*) ;; *) bad "--load BEST --eval: $out" ;; esac

# --grad-accum 2 --batch 6 reads the rows of --batch 12: the same losses
for order in "" --shuffle; do
    g --batch 12 --steps 4 $order | grep '^step' | strip > "$d/b12"
    g --batch 6 --grad-accum 2 --steps 4 $order | grep '^step' | strip > "$d/b6"
    paste -d' ' "$d/b12" "$d/b6" | awk '{ d = $4 - $8; if (d < 0) d = -d; if (d > 1e-5 || $2 != $6) bad = 1; n++ }
        END { exit bad || n != 4 }' || bad "--grad-accum 2 --batch 6 $order: $(paste "$d/b12" "$d/b6")"
done
g --batch 6 --grad-accum 2 --steps 1 | grep -q "; 2 micro-batch(es) of 6 x 16 tokens per step$" || bad "--grad-accum 2: no settings line"
# ... and the same gradients: after one step AdamW's exp_avg is 0.1 g (within 1e-4 relative)
g --batch 12 --steps 1 --shuffle --save "$d/g12" > /dev/null && g --batch 6 --grad-accum 2 --steps 1 --shuffle --save "$d/g6" > /dev/null ||
    bad "--grad-accum 2 --save: exit status $?"
for w in transformer.wte.weight:7 transformer.h.0.attn.c_attn.weight:100 transformer.h.1.mlp.c_proj.weight:1000 transformer.ln_f.bias:7; do
    a=$(f32 "$d/g12" "optim.${w%:*}.exp_avg" "${w#*:}")
    m=$(f32 "$d/g6" "optim.${w%:*}.exp_avg" "${w#*:}")
    close "$(awk -v a="$a" -v m="$m" 'BEGIN {print (a - m) / a}')" 0 1e-4 ||
        bad "--grad-accum 2 --batch 6: the gradient of $w is $m / 0.1, --batch 12's $a / 0.1"
done

# --beta1 0.8 --beta2 0.99: after one step exp_avg = 0.2 g, exp_avg_sq = 0.01 g^2
one="--batch 2 --steps 1 --warmup 0 --lr 0.01 --weight-decay 0.5"
g $one --beta1 0.8 --beta2 0.99 --save "$d/betas" > /dev/null || bad "--beta1 --beta2: exit status $?"
w=transformer.h.0.attn.c_attn.weight
for i in 0 7 100; do
    m=$(f32 "$d/betas" "optim.$w.exp_avg" $i)
    v=$(f32 "$d/betas" "optim.$w.exp_avg_sq" $i)
    close "$(awk -v m="$m" -v v="$v" 'BEGIN {print m * m / v}')" 4 4e-4 ||
        bad "--beta1 0.8 --beta2 0.99: exp_avg $m, exp_avg_sq $v (element $i), not the ratio 0.2^2 / 0.01 = 4"
done
# --decay-groups: wpe row 20 (positions 0-15 only are read: no gradient)
g $one --save "$d/lin" > /dev/null && g $one --decay-groups 2d --save "$d/2d" > /dev/null || bad "--decay-groups: exit status $?"
for i in 640 651; do
    l=$(f32 "$d/lin" transformer.wpe.weight $i)
    t=$(f32 "$d/2d" transformer.wpe.weight $i)
    close "$t" "$(awk -v l="$l" 'BEGIN {print l * (1 - 0.01 * 0.5)}')" 1e-7 ||
        bad "--decay-groups 2d: wpe element $i $t, expected $l x (1 - lr wd) (linear: $l)"
done
[ "$(f32 "$d/lin" transformer.wpe.weight 640)" != "$(f32 "$d/2d" transformer.wpe.weight 640)" ] || bad "--decay-groups 2d left wpe as it was"

# --no-bias: no linear bias; Hugging Face's format round-trips it
g --no-bias --batch 2 --steps 2 --save "$d/nb" --export "$d/nb.safetensors" --sample 30 > "$d/nb.a" 2>&1 || bad "--no-bias: exit status $?"
n=$(od -An -tu8 -N8 "$d/nb" | tr -d ' ')
hdr=$(head -c $((8 + n)) "$d/nb" | tail -c "$n")
case "$hdr" in *"c_attn.bias"* | *"c_fc.bias"* | *"c_proj.bias"*) bad "--no-bias: a linear bias in the checkpoint" ;; esac
case "$hdr" in *'"transformer.h.1.attn.c_attn.weight"'*) ;; *) bad "--no-bias: no c_attn.weight in the checkpoint" ;; esac
grep -q "; no biases$" "$d/nb.a" || bad "--no-bias: the settings line does not say it"
"$gpt" --init "$d/nb.safetensors" --sample 30 --threads 1 > "$d/nb.b" 2>&1 || bad "--init of a --no-bias export: exit status $?"
[ "$(tail -n 2 "$d/nb.a")" = "$(tail -n 2 "$d/nb.b")" ] || bad "--no-bias: the exported model samples another text"

# refusals, each with its message and status 1
g --steps 0 --export "$d/h.safetensors" > /dev/null || bad "--export h.safetensors: exit status $?"
refuse() { # refuse "MESSAGE" ARGS...
    want=$1; shift
    got=$(g "$@" 2>&1)
    rc=$?
    [ $rc -eq 1 ] && [ "$got" = "$want" ] || bad "gpt $*: status $rc, \"$got\", expected \"$want\""
}
refuse "gpt: --val x and --val-split 0.1 both give a validation set: give one" --val x --val-split 0.1 --steps 1
refuse "gpt: --val-split F takes the last F of --data's tokens for validation: F must be between 0 and 1 (nanoGPT's 90/10 split is 0.1), got 1" --val-split 1 --steps 1
refuse "gpt: --beta2 must be below 1, got 1" --beta2 1 --steps 1
refuse "gpt: --lr-schedule must be constant, cosine or linear, got \"step\"" --lr-schedule step --steps 1
refuse "gpt: --decay-groups must be linear or 2d, got \"all\"" --decay-groups all --steps 1
refuse "gpt: --min-lr shapes a decaying --lr-schedule (cosine or linear); the constant one (the default) has none" --min-lr 0.1 --steps 1
refuse "gpt: --min-lr 0.01 is above --lr 0.003: the schedule decays from --lr to --min-lr" --lr-schedule cosine --min-lr 0.01 --steps 100
refuse "gpt: --lr-decay-steps 10 (by default --steps) is less than --warmup 20: the linear decay runs from the end of the warmup to that step" --lr-schedule linear --steps 10
refuse "gpt: --save-best FILE keeps the model of the lowest validation loss: give a validation set (--val FILE or --val-split F)" --save-best "$d/x" --steps 10
refuse "gpt: --eval-iters 3: nothing evaluates; give --val FILE, --val-split F or --eval-interval N (or --eval)" --eval-iters 3 --steps 10
refuse "gpt: --eval-interval is a training flag: it needs --steps N (--eval scores the model as it is, once)" --eval --eval-interval 5
refuse "gpt: --grad-accum is a training flag: it needs --steps N (--eval scores the model as it is, once)" --eval --grad-accum 2
refuse "gpt: --val-split gives a validation set to training (--steps N) or --eval" --val-split 0.1 --sample 3
refuse "gpt: --grad-accum with --dist is not supported: --dist averages the gradients of every backward (give a larger --batch, or more ranks)" --grad-accum 2 --dist --steps 1
refuse "gpt: --export $d/x.bin: llm.c's checkpoints hold biases and this model has none (--no-bias); give a .safetensors name (Hugging Face's format)" --no-bias --steps 1 --export "$d/x.bin"
refuse "gpt: --no-bias contradicts --init $d/h.safetensors, whose model has biases; drop --no-bias" --init "$d/h.safetensors" --no-bias --sample 1
out=$(g --seq 32 --val-split 0.00001 --steps 1 2>&1 >/dev/null)
[ "$out" = "gpt: the validation part (--val-split) of \"examples/data/kjv.txt\" has 9 tokens, fewer than --seq 32 + 1" ] ||
    bad "--val-split 0.00001: \"$out\""

rm -rf "$d"
[ "$fails" -eq 0 ] && echo "gpt-train-check: ok (--eval over the file's windows; --val and --val-split; evaluations at 0, every N and the last step, training untouched; cosine, linear and constant rates; --save-best; --grad-accum 2 = --batch 12; --beta1/--beta2 in AdamW's moments; --decay-groups 2d on wpe; --no-bias round-trips; 17 refusals)"
exit "$fails"
