#!/bin/sh
# examples_check.sh BUILD: what examples/gpt refuses, and when: a --save whose
# folder cannot take the file is refused before the first step (not after
# the last), and --sample of any size streams tokens (nothing holds all of
# them: 2^61 used to wrap a malloc and abort); the second-order examples
# (newton, gradient_penalty) run to the end and their last line says they
# reached what PyTorch reaches; tokenize encodes, decodes and writes llm.c's
# token file with GPT-2's vocabulary, and refuses bad ids (writing nothing)
# and bad files, naming each and the reason; gpt killed while saving leaves
# no temporary file, --export keeps the head count, and progress lines go to
# terminals only, never from MPI ranks. Run by make test.
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
# --decode checks every id before it writes a byte: a bad one late writes nothing
printf '15496 11 995\n50257 11' | "$tk" --tokenizer "$voc" --decode > "$b/examples-check.out" 2> "$b/examples-check.err"
rc=$?
out=$(cat "$b/examples-check.err")
[ $rc -eq 1 ] && [ "$out" = "tokenize: --decode: id 50257 at position 3 is not in the vocabulary (ids are 0..50256)" ] ||
    bad "tokenize --decode 50257: \"$out\""
[ -s "$b/examples-check.out" ] && bad "tokenize --decode 50257: wrote \"$(cat "$b/examples-check.out")\" before failing"
printf '15496 11 x995' | "$tk" --tokenizer "$voc" --decode > "$b/examples-check.out" 2> "$b/examples-check.err"
rc=$?
out=$(cat "$b/examples-check.err")
[ $rc -eq 1 ] && [ "$out" = "tokenize: --decode: \"x995\" (word 2) is not a token id (a non-negative integer)" ] ||
    bad "tokenize --decode x995: \"$out\""
[ -s "$b/examples-check.out" ] && bad "tokenize --decode x995: wrote \"$(cat "$b/examples-check.out")\" before failing"
# an id too large for any integer is out of the vocabulary (it was "not a token id")
out=$(echo "11 123456789012345678901234567890" | "$tk" --tokenizer "$voc" --decode 2>&1 >/dev/null)
[ "$out" = "tokenize: --decode: id 123456789012345678901234... at position 1 is not in the vocabulary (ids are 0..50256)" ] ||
    bad "tokenize --decode 1234...: \"$out\""
# messages name the file and the reason (--in DIR said "cannot read standard input")
mkdir -p "$b/examples-check.d"
out=$("$tk" --tokenizer "$voc" --in "$b/examples-check.d" 2>&1)
[ $? -eq 1 ] && [ "$out" = "tokenize: --in: cannot read \"$b/examples-check.d\": Is a directory" ] ||
    bad "tokenize --in DIR: \"$out\""
out=$("$tk" --tokenizer "$voc" --decode --in "$b/examples-check.d" 2>&1)
[ "$out" = "tokenize: --in: cannot read \"$b/examples-check.d\": Is a directory" ] ||
    bad "tokenize --decode --in DIR: \"$out\""
out=$("$tk" --tokenizer "$voc" < "$b/examples-check.d" 2>&1)
[ "$out" = "tokenize: cannot read standard input: Is a directory" ] || bad "tokenize < DIR: \"$out\""
out=$(echo hi | "$tk" --tokenizer "$b/examples-check.d" 2>&1)
[ "$out" = "tokenize: nb_tokenizer_load: \"$b/examples-check.d\" is a directory, not a tokenizer file (give the tokenizer.json, vocab.json, encoder.json or gpt2_tokenizer.bin in it)" ] ||
    bad "tokenize --tokenizer DIR: \"$out\""
out=$(echo hi | "$tk" --tokenizer "$voc" --out "$b/examples-check.d" 2>&1)
[ "$out" = "tokenize: --out: cannot write \"$b/examples-check.d\": Is a directory" ] || bad "tokenize --out DIR: \"$out\""
out=$(echo hi | "$tk" --tokenizer "$voc" --in /dev/null --in x 2>&1)
[ $? -eq 1 ] && [ "$out" = "tokenize: --in is given twice (\"/dev/null\" and \"x\")" ] || bad "tokenize --in twice: \"$out\""
# llm.c's gpt2_tokenizer.bin with a bad magic number (it was read as JSON)
printf '\307\327\064\001\002\000\000\000' > "$b/examples-check.d/gpt2_tokenizer.bin"
out=$(echo 1 | "$tk" --tokenizer "$b/examples-check.d/gpt2_tokenizer.bin" --decode 2>&1)
[ "$out" = "tokenize: nb_tokenizer_load: \"$b/examples-check.d/gpt2_tokenizer.bin\": bad magic number 20240327 for llm.c's gpt2_tokenizer.bin (expected 20240328)" ] ||
    bad "tokenize on a bad gpt2_tokenizer.bin: \"$out\""
# a write that fails is said (encoding to a full disk exited 0), and --out
# leaves no part of a file behind (here past the file size limit, 1 block)
if [ -w /dev/full ]; then
    out=$(echo hi | "$tk" --tokenizer "$voc" 2>&1 > /dev/full)
    [ $? -eq 1 ] && [ "$out" = "tokenize: cannot write standard output: No space left on device" ] ||
        bad "tokenize > /dev/full: \"$out\""
    out=$(echo 11 | "$tk" --tokenizer "$voc" --decode 2>&1 > /dev/full)
    [ $? -eq 1 ] && [ "$out" = "tokenize: cannot write standard output: No space left on device" ] ||
        bad "tokenize --decode > /dev/full: \"$out\""
fi
out=$(trap '' XFSZ; ulimit -f 1 && echo hi | "$tk" --tokenizer "$voc" --out "$b/examples-check.tok" 2>&1)
[ "$out" = "tokenize: --out: cannot write \"$b/examples-check.tok\": File too large (the part written was removed)" ] ||
    bad "tokenize --out past the size limit: \"$out\""
[ -e "$b/examples-check.tok" ] && bad "tokenize --out past the size limit: a part of the file is left"
# gpt --tokenizer passes the loader's message on, with the file and the reason
out=$("$gpt" --config tiny --steps 0 --tokenizer "$b/examples-check.d/gpt2_tokenizer.bin" 2>&1)
[ $? -ne 0 ] && [ "$out" = "gpt: nb_tokenizer_load: \"$b/examples-check.d/gpt2_tokenizer.bin\": bad magic number 20240327 for llm.c's gpt2_tokenizer.bin (expected 20240328)" ] ||
    bad "gpt --tokenizer on a bad gpt2_tokenizer.bin: \"$out\""
out=$("$gpt" --config tiny --steps 0 --tokenizer "$b/examples-check.d" 2>&1)
[ $? -ne 0 ] && [ "$out" = "gpt: nb_tokenizer_load: \"$b/examples-check.d\" is a directory, not a tokenizer file (give the tokenizer.json, vocab.json, encoder.json or gpt2_tokenizer.bin in it)" ] ||
    bad "gpt --tokenizer DIR: \"$out\""
rm -rf "$b/examples-check.d" "$b/examples-check.out" "$b/examples-check.err" "$b/examples-check.tok"
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

# examples/gpt --save-every 1 SIGKILLed at various moments: the checkpoint
# always loads, and once it has, no temporary file (.nabla-tmp-*) is left in
# its folder (killed saves used to leave one each, the checkpoint's size).
kd=$b/kill-check
rm -rf "$kd" && mkdir -p "$kd"
for i in 1 2 3 4 5 6; do
    rm -f "$kd/ck"
    "$gpt" --config tiny --batch 2 --seq 16 --steps 100000000 --save-every 1 --save "$kd/ck" > /dev/null 2>&1 &
    pid=$!
    n=0
    while [ ! -f "$kd/ck" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
    sleep "0.$i" # a few steps later: most of a step's time goes to its save
    kill -9 "$pid"
    wait "$pid" 2> /dev/null
    out=$("$gpt" --config tiny --batch 2 --seq 16 --load "$kd/ck" --eval 2>&1) ||
        bad "gpt --save-every 1 killed (round $i): --load failed: $out"
    left=$(ls -A "$kd" | grep -c '^\.nabla-tmp-')
    [ "$left" -eq 0 ] || bad "gpt --save-every 1 killed (round $i): $left temporary file(s) left after --load: $(ls -A "$kd")"
done
rm -rf "$kd"

# The head count through --export (the one size no tensor shows): a char
# model (n_embd 128) of 4 heads, where heads of 64 would make 2, comes back
# from Hugging Face's format with 4 and samples the same text; an --n-head
# the file contradicts is refused; a Hugging Face file without the count
# (tests/gpt_files.h's small: n_embd 128, 2 heads) warns of its guess, or
# takes config.json's from beside it.
hd=$b/heads-check
rm -rf "$hd" && mkdir -p "$hd"
"$gpt" --steps 3 --batch 2 --export "$hd/m.safetensors" --sample 40 > "$hd/a" 2>&1 ||
    bad "gpt --export m.safetensors: exit status $?: $(tail -n 1 "$hd/a")"
"$gpt" --init "$hd/m.safetensors" --sample 40 > "$hd/b" 2>&1 ||
    bad "gpt --init m.safetensors: exit status $?: $(tail -n 1 "$hd/b")"
grep -q "4 layers, 4 heads, n_embd 128" "$hd/b" || bad "gpt --init m.safetensors (4 heads exported): $(head -n 1 "$hd/b")"
[ "$(tail -n 2 "$hd/a")" = "$(tail -n 2 "$hd/b")" ] || bad "gpt --init m.safetensors samples another text than the model exported"
grep -q "warning" "$hd/b" && bad "gpt --init m.safetensors warns: $(grep warning "$hd/b")"
out=$("$gpt" --init "$hd/m.safetensors" --n-head 2 --sample 4 2>&1)
[ $? -eq 1 ] && [ "$out" = "gpt: --n-head 2 contradicts --init $hd/m.safetensors, whose model has n_head 4 (stored in the file); drop --n-head to take the file's" ] ||
    bad "gpt --init m.safetensors --n-head 2: \"$out\""
"$b/tests/gen_gpt_files" small "$hd" > /dev/null || bad "gen_gpt_files small failed"
out=$("$gpt" --init "$hd/m.safetensors" --export "$hd/m.bin" 2>&1)
case "$out" in
*"sampling"*) bad "gpt --init A --export B says it samples: $out" ;;
*"gpt: no training (no --steps): converting $hd/m.safetensors to $hd/m.bin as it is"*) ;;
*) bad "gpt --init A --export B does not say it converts A to B: $out" ;;
esac
out=$("$gpt" --init "$hd/m.bin" --export "$hd/m2.safetensors" --sample 4 2>&1)
case "$out" in
*"gpt: no training (no --steps): converting $hd/m.bin to $hd/m2.safetensors as it is, then sampling from it"*) ;;
*) bad "gpt --init A --export B --sample 4: $out" ;;
esac
hf=$hd/small_hf.safetensors
out=$("$gpt" --init "$hf" --sample 4 2>&1)
case "$out" in
*"gpt: warning: --init $hf does not say how many attention heads its model has (no n_head in its __metadata__, no config.json beside it): guessing n_head 2 (heads of 64 channels, as in every GPT-2 size); if the model was trained with another count it will compute something else: give --n-head N"*"2 layers, 2 heads"*) ;;
*) bad "gpt --init a Hugging Face file without its head count: no warning of the guess: $out" ;;
esac
printf '{"model_type": "gpt2", "n_ctx": 32, "n_embd": 128, "n_head": 4, "n_layer": 2, "n_positions": 32, "layer_norm_epsilon": 1e-05, "vocab_size": 101}\n' > "$hd/config.json"
out=$("$gpt" --init "$hf" --sample 4 2>&1)
case "$out" in
*warning*) bad "gpt --init with config.json beside it still warns: $out" ;;
*"2 layers, 4 heads, n_embd 128"*) ;;
*) bad "gpt --init with config.json (4 heads) beside it: $out" ;;
esac
out=$("$gpt" --init "$hf" --n-head 2 --sample 4 2>&1)
[ $? -eq 1 ] && [ "$out" = "gpt: --n-head 2 contradicts --init $hf, whose model has n_head 4 (in the config.json beside it); drop --n-head to take the file's" ] ||
    bad "gpt --init (config.json: 4 heads) --n-head 2: \"$out\""
rm -rf "$hd"

# Progress lines ("\r", ESC [K) only on a terminal that is the process's
# own: copy_task (stdout) and gpt (stderr) run on a pseudo-terminal (script)
# draw them; the same runs as ranks of an MPI job (whose stdout mpirun makes
# a terminal even when its own output goes to a file: the launcher's
# variable set here as mpirun sets it) do not.
esc=$(printf '\033')
if command -v script > /dev/null 2>&1 && script -qec true /dev/null > /dev/null 2>&1; then
    cp_args="--epochs 1 --batches 3 --d-model 32 --d-ff 64 --check 10"
    gpt_args="--config tiny --steps 3 --batch 2 --seq 16"
    for run in "copy_task $cp_args" "gpt $gpt_args"; do
        script -qec "$b/examples/$run" /dev/null > "$b/progress-check.out" 2>&1
        grep -q "$esc" "$b/progress-check.out" || bad "$run on a terminal: no progress line"
        script -qec "env OMPI_COMM_WORLD_SIZE=2 $b/examples/$run" /dev/null > "$b/progress-check.out" 2>&1
        grep -q "$esc" "$b/progress-check.out" && bad "$run as an MPI rank on a terminal: a progress line (ESC) in its output"
    done
    rm -f "$b/progress-check.out"
else
    say "no script(1) here: the progress lines' terminal check is skipped"
fi

[ "$fails" -eq 0 ] && say "ok (progress lines on terminals only, not from MPI ranks; gpt killed while saving leaves no temporary; gpt --export keeps the head count, refuses a contradicting --n-head, reads config.json, warns of a guess, says it converts; --save checked before training; --sample 2^61 streams; newton and gradient_penalty converge; tokenize encodes, decodes and writes llm.c token files, and names the file and reason of each failure, writing nothing on a bad id; fashion_mnist trains alike on 1 and 2 threads, resumes exactly, names missing or disagreeing files and a refused flag)"
exit "$fails"
