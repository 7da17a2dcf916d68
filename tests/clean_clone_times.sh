#!/bin/sh
# clean_clone_times.sh TARGET...: how long each `make TARGET` takes from a
# clean clone of this repository's HEAD, build included, as README.md and
# docs/ quote them: each target in a fresh clone of its own (so none reuses
# another's build), with make's default parallelism (every CPU: MAKELEVEL and
# MAKEFLAGS of a calling make are dropped, or the Makefile would not add its
# -j and every build would run on one CPU). Prints one
# line per target, the whole command's wall time, after the time of a plain
# make (the library and examples) in a clone of its own.
set -u
repo=$(git rev-parse --show-toplevel) || exit 1
cpus=$(nproc 2>/dev/null || echo 1)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
secs() { # seconds of: make -C dir target (its output to dir/.log)
    t0=$(date +%s.%N)
    env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make -C "$1" --no-print-directory "$2" > "$1/.log" 2>&1 || { tail -20 "$1/.log"; return 1; }
    t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{ printf "%.0f", $2 - $1 }'
}
git clone -q "$repo" "$tmp/build-only" || exit 1
build=$(secs "$tmp/build-only" all) || { echo "clean-clone-times: make failed"; exit 1; }
echo "clean-clone-times: HEAD $(git -C "$repo" rev-parse --short HEAD), $cpus CPU(s), $cpu"
echo "make (the build alone): $build s"
for t in "$@"; do
    rm -rf "$tmp/c"
    git clone -q "$repo" "$tmp/c" || exit 1
    s=$(secs "$tmp/c" "$t") || { echo "make $t: FAILED"; exit 1; }
    echo "make $t: $s s from a clean clone (make alone builds in $build s)"
done
