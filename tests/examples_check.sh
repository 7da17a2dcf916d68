#!/bin/sh
# examples_check.sh BUILD: what examples/gpt refuses, and when: a --save whose
# folder cannot take the file is refused before the first step (not after
# the last), and --sample of any size streams tokens (nothing holds all of
# them: 2^61 used to wrap a malloc and abort); the second-order examples
# (newton, gradient_penalty) run to the end and their last line says they
# reached what PyTorch reaches; tokenize encodes, decodes and writes llm.c's
# token file with GPT-2's vocabulary, and refuses bad ids and files. Run by make test.
set -u
b=${1:-build}
gpt=$b/examples/gpt
fails=0
say() { echo "examples-check: $*"; }
bad() { say "FAIL: $*"; fails=$((fails + 1)); }

for dest in /nonexistent-nabla/dir/x.safetensors /etc/passwd/x.safetensors; do
    out=$("$gpt" --config tiny --steps 50 --save "$dest" 2>&1)
    rc=$?
    case "$out" in
    *"gpt: --save: cannot write \"$dest\""*) ;;
    *) bad "--save $dest: no message naming it: $out" ;;
    esac
    [ "$rc" -ne 0 ] || bad "--save $dest: exit status 0"
    case "$out" in *"step "*) bad "--save $dest: trained before refusing: $out" ;; esac
done

# 2^61 tokens: generation streams until stopped, never aborts. Counted in
# bytes, not seconds: 4096 bytes are read and the pipe closed, and gpt, still
# generating, ends on SIGPIPE at its next write (141; env makes SIGPIPE fatal
# even where the caller ignores it). timeout is a hang guard only (124): gpt
# writes those bytes in 0.2 s, in seconds on a loaded machine.
{ timeout 600 env --default-signal=PIPE "$gpt" --config tiny --steps 0 \
    --sample 2305843009213693952 2>&1; echo $? > "$b/examples-check.rc"; } |
    head -c 4096 > "$b/examples-check.out"
rc=$(cat "$b/examples-check.rc")
[ "$rc" -eq 141 ] || bad "--sample 2^61: exit status $rc, expected 141 (SIGPIPE: still streaming when its reader stopped)"
grep -q "sample (2305843009213693952 tokens" "$b/examples-check.out" || bad "--sample 2^61: no sample header"
[ "$(wc -c < "$b/examples-check.out")" -eq 4096 ] || bad "--sample 2^61: it stopped before writing 4096 bytes"
rm -f "$b/examples-check.out" "$b/examples-check.rc"

# last_line PROGRAM PATTERN: PROGRAM exits 0 and its last line matches PATTERN
last_line() {
    out=$("$b/examples/$1" 2>&1)
    rc=$?
    last=$(printf '%s\n' "$out" | tail -n 1)
    case "$last" in
    $2) ;;
    *) bad "$1: last line \"$last\", expected \"$2\"" ;;
    esac
    [ "$rc" -eq 0 ] || bad "$1: exit status $rc"
}
# the numbers PyTorch gives (tests/fixtures/gen_second_order.py): Newton takes 7 steps
# from (-1.2, 1); the critic's loss falls from 8.725266 to 1.957491
last_line newton "newton: converged to (1, 1) in 7 steps; Hv and the jvp agree with the references"
last_line gradient_penalty "gradient_penalty: loss fell from 8.725266 to 1.957491 in 10 steps"

# tokenize: GPT-2's tokenizer on the real vocabulary (tests/fixtures/gpt2)
tk=$b/examples/tokenize
voc=tests/fixtures/gpt2/encoder.json
got=$(printf 'Hello, world<|endoftext|> caf\303\251\n' | "$tk" --tokenizer "$voc")
[ "$got" = "15496 11 995 50256 40304 198" ] || bad "tokenize: got \"$got\""
back=$(printf '15496 11\n995  50256\t40304' | "$tk" --tokenizer "$voc" --decode)
[ "$back" = "$(printf 'Hello, world<|endoftext|> caf\303\251')" ] || bad "tokenize --decode: got \"$back\""
printf 'Hello, world' | "$tk" --tokenizer "$voc" --out "$b/examples-check.tok" || bad "tokenize --out failed"
# llm.c's token file: 1024-byte header (20240520, 1, 3), then 3 uint16 LE
hdr=$(od -An -tu4 -N12 "$b/examples-check.tok" | tr -s ' ')
[ "$hdr" = " 20240520 1 3" ] || bad "tokenize --out: header \"$hdr\""
ids=$(od -An -tu2 -j1024 "$b/examples-check.tok" | tr -s ' ')
[ "$ids" = " 15496 11 995" ] || bad "tokenize --out: ids \"$ids\""
rm -f "$b/examples-check.tok"
out=$(echo "1 50257" | "$tk" --tokenizer "$voc" --decode 2>&1 >/dev/null)
[ $? -eq 1 ] && [ "$out" = "tokenize: --decode: id 50257 at position 1 is not in the vocabulary (nb_tokenizer_token: id 50257 is not in [0, 50257))" ] ||
    bad "tokenize --decode 50257: \"$out\""
out=$(echo hi | "$tk" --tokenizer /nonexistent/vocab.json 2>&1)
[ $? -eq 1 ] && [ "$out" = "tokenize: nb_tokenizer_load: cannot open \"/nonexistent/vocab.json\": No such file or directory" ] ||
    bad "tokenize on a missing file: \"$out\""
"$tk" --help | grep -q "usage: .*--tokenizer PATH" || bad "tokenize --help"

# fashion_mnist on tests/fixtures/fashion-mini (64 training, 32 test images):
# the last line's form; the same lines on 1 and 2 threads (bitwise: the
# losses and accuracies printed to 4 places, and the checkpoint's bytes);
# a run resumed from its checkpoint prints what the straight run prints;
# a missing folder and counts that disagree are messages naming the files.
fm=$b/examples/fashion_mnist
mini=tests/fixtures/fashion-mini
fm_run() { # fm_run OUT ARGS...: the run's lines without times
    o=$1; shift
    "$fm" --data "$mini" --batch 16 --bn --svg "$b/fm-check.svg" "$@" > "$o.raw" 2>&1 || bad "fashion_mnist $*: exit status $?: $(tail -1 "$o.raw")"
    sed -e 's/  epoch time.*//' -e 's/^training .*//' -e 's/, [0-9]* thread(s)$//' "$o.raw" > "$o"
}
fm_run "$b/fm1" --epochs 2 --threads 1 --save "$b/fm1.ckpt"
fm_run "$b/fm2" --epochs 2 --threads 2 --save "$b/fm2.ckpt"
last=$(tail -n 1 "$b/fm1.raw")
case "$last" in
"test accuracy 0."[0-9][0-9][0-9][0-9]" ("[0-9]*"/32)") ;;
*) bad "fashion_mnist: last line \"$last\", expected \"test accuracy 0.xxxx (n/32)\"" ;;
esac
grep -q '^epoch  2  loss [0-9.]*  test accuracy 0\.[0-9]*$' "$b/fm1" || bad "fashion_mnist: no line for epoch 2: $(cat "$b/fm1.raw")"
grep -q '^9 Ankle boot ' "$b/fm1" || bad "fashion_mnist: no confusion matrix"
grep -q '<svg' "$b/fm-check.svg" || bad "fashion_mnist: no SVG of the misclassified images"
cmp -s "$b/fm1" "$b/fm2" ||
    bad "fashion_mnist: 1 and 2 threads print different results: $(diff "$b/fm1" "$b/fm2" | head -5)"
cmp -s "$b/fm1.ckpt" "$b/fm2.ckpt" || bad "fashion_mnist: 1 and 2 threads save different checkpoints"
fm_run "$b/fm3" --epochs 1 --threads 1 --save "$b/fm3.ckpt"
fm_run "$b/fm4" --epochs 2 --threads 1 --load "$b/fm3.ckpt"
# the resumed run prints epoch 2 and the end exactly as the straight run does
[ "$(grep -v '^resumed from' "$b/fm4")" = "$(grep -v '^epoch  1 ' "$b/fm1")" ] ||
    bad "fashion_mnist --load: the resumed run differs from the straight one: $(diff "$b/fm1" "$b/fm4" | head -6)"
out=$("$fm" --data "$b/no-such-dir" 2>&1)
[ $? -eq 1 ] && [ "$out" = "fashion_mnist: no Fashion-MNIST in $b/no-such-dir ($b/no-such-dir/train-images-idx3-ubyte: No such file or directory). \`make fashion\` gets it: it installs Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) and gunzips its four files from /usr/share/datasets/fashion-mnist into build/data/fashion-mnist" ] ||
    bad "fashion_mnist on a missing folder: \"$out\""
mkdir -p "$b/fm-bad"
cp "$mini/train-images-idx3-ubyte" "$b/fm-bad/train-images-idx3-ubyte"
cp "$mini/t10k-labels-idx1-ubyte" "$b/fm-bad/train-labels-idx1-ubyte"
out=$("$fm" --data "$b/fm-bad" 2>&1)
[ $? -eq 1 ] && [ "$out" = "fashion_mnist: $b/fm-bad/train-images-idx3-ubyte has 64 images but $b/fm-bad/train-labels-idx1-ubyte has 32 labels: the counts must agree" ] ||
    bad "fashion_mnist on counts that disagree: \"$out\""
out=$("$fm" --data "$mini" --label-smoothing 1.5 2>&1 | head -1)
[ "$out" = "fashion_mnist: --label-smoothing 1.5 is out of range (the usage below gives each flag)" ] ||
    bad "fashion_mnist --label-smoothing 1.5: \"$out\""
out=$("$fm" --data "$mini" --schedule step 2>&1 | head -1)
[ "$out" = "fashion_mnist: --schedule must be cosine or exp, got \"step\"" ] ||
    bad "fashion_mnist --schedule step: \"$out\""
rm -rf "$b/fm-bad" "$b"/fm[0-9]* "$b/fm-check.svg"

[ "$fails" -eq 0 ] && say "ok (--save checked before training; --sample 2^61 streams; newton and gradient_penalty converge; tokenize encodes, decodes and writes llm.c token files; fashion_mnist trains alike on 1 and 2 threads, resumes exactly, names missing or disagreeing files and a refused flag)"
exit "$fails"
