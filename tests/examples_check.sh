#!/bin/sh
# examples_check.sh BUILD: what examples/gpt refuses, and when: a --save whose
# folder cannot take the file is refused before the first step (not after
# the last), and --sample of any size streams tokens (nothing holds all of
# them: 2^61 used to wrap a malloc and abort); the second-order examples
# (newton, gradient_penalty) run to the end and their last line says they
# reached what PyTorch reaches. Run by make test.
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

# 2^61 tokens: generation streams until stopped (timeout's 124), never aborts
timeout 3 "$gpt" --config tiny --steps 0 --sample 2305843009213693952 > "$b/examples-check.out" 2>&1
rc=$?
[ "$rc" -eq 124 ] || bad "--sample 2^61: exit status $rc, expected 124 (still streaming at the timeout)"
grep -q "sample (2305843009213693952 tokens" "$b/examples-check.out" || bad "--sample 2^61: no sample header"
[ "$(wc -c < "$b/examples-check.out")" -gt 200 ] || bad "--sample 2^61: fewer than 200 bytes in 3 s"
rm -f "$b/examples-check.out"

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

[ "$fails" -eq 0 ] && say "ok (--save checked before training; --sample 2^61 streams; newton and gradient_penalty converge)"
exit "$fails"
