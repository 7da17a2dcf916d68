#!/bin/bash
# mutation_check.sh: how strong is the test suite? Each mutant of
# tests/mutants.txt (a one-line change to the library, a plausible bug) is
# applied to a scratch copy of the tree under build/mutation/tree (the
# working tree is never touched), the library and the test runner are built
# there (make -j2) and make test's suites run against it. A mutant is
# killed when a suite fails where the unmutated tree passes (a test that
# fails on the unmutated tree too does not count), crashes or runs past the
# timeout, or when the fuzz corpus replay or tests/examples_check.sh fails.
# Run by make mutation-check; not part of make test or CI.
#
#   tests/mutation_check.sh            every mutant
#   MUTANTS=ce-*,ln-backward-strided   a subset (names, or shell patterns)
#   MUTATION_TIMEOUT=600               seconds of tests per mutant
#   tests/mutation_check.sh --list     which mutants still apply (no build)
#
# Suites run one at a time (CK_RUN_SUITE), the mutant's `suites:` first,
# then the others from the fastest (as timed on the unmutated tree), and
# the first new failure ends the mutant's run. Logs: build/mutation/logs/.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
list=$root/tests/mutants.txt
work=$root/build/mutation
tree=$work/tree
logs=$work/logs
base=$work/baseline
timeout_s=${MUTATION_TIMEOUT:-600}
select=${MUTANTS:-}
list_only=false
[ "${1:-}" = --list ] && list_only=true
unset MAKEFLAGS MFLAGS MAKELEVEL # the scratch build is a make of its own
export CK_FORK=yes LC_ALL=C

die() { echo "mutation-check: $*" >&2; exit 2; }
[ -f "$list" ] || die "no $list"

# ------------------------------------------------------------ the mutants
# Blocks of "key: value" lines separated by blank lines; '#' starts a comment
# line. Keys: name, file, from (text that must occur exactly once in file),
# to (its replacement, may be empty), why (the bug, one line), suites
# (optional: the suites to try first, comma-separated).
names=() files=() froms=() tos=() whys=() hints=()
parse() {
    local line key val n="" f="" fr="" t="" w="" s="" have_to=false lineno=0 start=0
    flush() {
        if [ -n "$n$f$fr$w" ]; then
            [ -n "$n" ] && [ -n "$f" ] && [ -n "$fr" ] && [ -n "$w" ] && $have_to ||
                die "tests/mutants.txt:$start: a mutant needs name, file, from, to and why"
            local k
            for k in "${names[@]}"; do [ "$k" = "$n" ] && die "tests/mutants.txt:$start: name $n used twice"; done
            names+=("$n") files+=("$f") froms+=("$fr") tos+=("$t") whys+=("$w") hints+=("$s")
        fi
        n="" f="" fr="" t="" w="" s="" have_to=false
    }
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        case $line in
        '#'*) continue ;;
        '') flush; continue ;;
        esac
        [ -z "$n$f$fr$w$s" ] && ! $have_to && start=$lineno
        key=${line%%:*}
        val=${line#*:}
        val=${val#"${val%%[! ]*}"}     # leading blanks
        val=${val%"${val##*[! ]}"}     # trailing blanks
        case $key in
        name) n=$val ;;
        file) f=$val ;;
        from) fr=$val ;;
        to) t=$val; have_to=true ;;
        why) w=$val ;;
        suites) s=$val ;;
        *) die "tests/mutants.txt:$lineno: unknown key \"$key\"" ;;
        esac
    done < "$list"
    flush
}
parse

wanted() { # name: in MUTANTS (names or patterns, comma-separated), or all
    [ -z "$select" ] && return 0
    local p IFS=,
    for p in $select; do
        # shellcheck disable=SC2254
        case $1 in $p) return 0 ;; esac
    done
    return 1
}

# How often `from` occurs in file (exact text).
occurrences() { # file from
    FROM=$2 perl -0777 -ne '$n = () = /\Q$ENV{FROM}\E/g; print $n' "$1"
}

# ---------------------------------------------------------- the scratch tree
sources() { # the tree's files, relative, NUL-separated
    if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$root" ls-files -co --exclude-standard -z
    else
        (cd "$root" && find . \( -path ./build -o -path './build-*' -o -path ./.git \) -prune \
            -o -type f -print0 | sed -z 's|^\./||')
    fi
}

sync_tree() { # copies what differs; removes what the tree no longer has
    mkdir -p "$tree"
    local f
    sources > "$work/files"
    while IFS= read -r -d '' f; do
        [ -f "$root/$f" ] || continue
        if ! cmp -s "$root/$f" "$tree/$f"; then
            mkdir -p "$(dirname "$tree/$f")"
            cp "$root/$f" "$tree/$f"
        fi
    done < "$work/files"
    (cd "$tree" && find . \( -path ./build -prune \) -o -type f -print0 | sed -z 's|^\./||') |
        while IFS= read -r -d '' f; do
            grep -qzxF -- "$f" "$work/files" || rm -f "$tree/$f"
        done
}

build() { # log: library, runner, replay, the examples and what examples_check.sh runs
    local ex
    ex=$(cd "$tree" && for f in examples/*.c; do echo "build/${f%.c}"; done)
    # shellcheck disable=SC2086
    make -C "$tree" -j2 --no-print-directory BUILD=build build/libnabla.a build/tests/run_tests \
        build/fuzz/replay build/tests/gen_gpt_files $ex > "$1" 2>&1
}

suites_all=$(grep -ho 'suite_create("[a-z0-9_]*")' "$root"/tests/*.c | sed 's/.*("\(.*\)")/\1/')

# Runs one suite, its output into out: 0 (it ran to its summary), 1 (it
# crashed) or 124 (timed out).
run_suite() { # suite seconds out
    local rc
    (cd "$tree" && CK_RUN_SUITE=$1 timeout -k 5 "$2" build/tests/run_tests) > "$3" 2>&1
    rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && return 124
    grep -q '^[0-9]*%: Checks: ' "$3" || return 1
    [ $rc -le 1 ] || return 1
    return 0
}
failures() { # log -> tcase:test:iteration, one a line
    sed -n 's/^[^ :]*:[0-9]*:[FE]:\([^:]*:[^:]*:[0-9]*\):.*/\1/p' "$1" | sort -u
}

baseline() { # the unmutated tree: failures and time of each suite
    local key s t0 log
    key=$(cd "$root" && sources | xargs -0 sha1sum 2>/dev/null | sha1sum | cut -c1-16)
    if [ -f "$base/key" ] && [ "$(cat "$base/key")" = "$key" ]; then return 0; fi
    rm -rf "$base"
    mkdir -p "$base"
    echo "mutation-check: building and running the unmutated tree (the baseline)"
    build "$base/build.log" || { tail -20 "$base/build.log"; die "the unmutated tree does not build"; }
    for s in $suites_all; do
        log=$base/$s.log
        t0=$(date +%s%N)
        run_suite "$s" 1800 "$log" || die "suite $s crashes or hangs on the unmutated tree ($log)"
        echo $((($(date +%s%N) - t0) / 1000000)) > "$base/$s.ms"
        failures "$log" > "$base/$s.fail"
        [ -s "$base/$s.fail" ] && echo "  baseline: suite $s fails on its own: $(tr '\n' ' ' < "$base/$s.fail")"
    done
    (cd "$tree" && build/fuzz/replay fuzz/corpus/ops) > "$base/replay.log" 2>&1 ||
        die "the fuzz replay fails on the unmutated tree ($base/replay.log)"
    (cd "$tree" && sh tests/examples_check.sh build) > "$base/examples.log" 2>&1 ||
        die "tests/examples_check.sh fails on the unmutated tree ($base/examples.log)"
    echo "$key" > "$base/key"
}

# The suites in the order a mutant runs them: its hints, then by time.
order() { # hints
    local s IFS=,
    for s in $1; do echo "$s"; done
    IFS=$' \t\n'
    for s in $suites_all; do echo "$(cat "$base/$s.ms" 2>/dev/null || echo 0) $s"; done |
        sort -n | cut -d' ' -f2
}

# ---------------------------------------------------------------- one mutant
restore() { # puts back the file a mutant changed (also on interrupt)
    if [ -n "${mutated:-}" ]; then
        cp "$work/orig" "$tree/$mutated"
        mutated=""
    fi
}
trap 'restore; exit 130' INT TERM
trap restore EXIT

# Prints the verdict's words; sets $how.
run_mutant() { # index
    local i=$1 f=${files[$1]} log=$logs/${names[$1]}.log n s rc deadline left new
    : > "$log"
    how=""
    n=$(occurrences "$tree/$f" "${froms[$i]}" 2>/dev/null || echo 0)
    if [ ! -f "$tree/$f" ] || [ "$n" != 1 ]; then
        how="the text is found $n times in $f, not once"
        [ -f "$tree/$f" ] || how="no file $f"
        return 3
    fi
    cp "$tree/$f" "$work/orig"
    mutated=$f
    FROM=${froms[$i]} TO=${tos[$i]} perl -0777 -pi -e \
        'my $k = index($_, $ENV{FROM}); substr($_, $k, length $ENV{FROM}) = $ENV{TO};' "$tree/$f"
    { echo "mutant ${names[$i]}: $f"; echo "- ${froms[$i]}"; echo "+ ${tos[$i]}"; } >> "$log"
    if ! build "$log.build"; then
        cat "$log.build" >> "$log"
        how="does not build"
        return 4
    fi
    rm -f "$log.build"
    deadline=$(($(date +%s) + timeout_s))
    for s in $(order "${hints[$i]}" | awk '!seen[$0]++'); do
        case " $(echo $suites_all) " in *" $s "*) ;; *) echo "unknown suite $s (suites: of ${names[$i]})" >> "$log"; continue ;; esac
        left=$((deadline - $(date +%s)))
        [ $left -gt 0 ] || { how="timed out (${timeout_s} s)"; return 0; }
        echo "=== suite $s" >> "$log"
        run_suite "$s" "$left" "$log.suite"
        rc=$?
        cat "$log.suite" >> "$log"
        case $rc in
        124) how="$s: timed out"; return 0 ;;
        1) how="$s: crashed"; return 0 ;;
        esac
        new=$(failures "$log.suite" | comm -23 - "$base/$s.fail" | head -3 | tr '\n' ' ')
        rm -f "$log.suite"
        if [ -n "$new" ]; then how="$s: ${new% }"; return 0; fi
    done
    echo "=== fuzz replay" >> "$log"
    (cd "$tree" && timeout -k 5 300 build/fuzz/replay fuzz/corpus/ops) >> "$log" 2>&1 ||
        { how="fuzz replay"; return 0; }
    echo "=== examples_check" >> "$log"
    (cd "$tree" && timeout -k 5 300 sh tests/examples_check.sh build) >> "$log" 2>&1 ||
        { how="tests/examples_check.sh"; return 0; }
    return 1
}

# ---------------------------------------------------------------------- main
mkdir -p "$work" "$logs"
sync_tree
if $list_only; then
    for i in "${!names[@]}"; do
        wanted "${names[$i]}" || continue
        n=0
        [ -f "$tree/${files[$i]}" ] && n=$(occurrences "$tree/${files[$i]}" "${froms[$i]}")
        if [ "$n" = 1 ]; then state=applies; else state="STALE (found $n times)"; fi
        printf '%-34s %-22s %s\n' "${names[$i]}" "${files[$i]}" "$state"
    done
    exit 0
fi

total=0
for i in "${!names[@]}"; do wanted "${names[$i]}" && total=$((total + 1)); done
[ $total -gt 0 ] || die "no mutant matches MUTANTS=$select (names: ${names[*]})"
baseline

killed=0 survived=0 stale=0 broken=0 k=0 survivors=""
started=$(date +%s)
for i in "${!names[@]}"; do
    wanted "${names[$i]}" || continue
    k=$((k + 1))
    t0=$(date +%s)
    run_mutant "$i"
    rc=$?
    restore
    secs=$(($(date +%s) - t0))
    tag=$(printf '[%d/%d]' "$k" "$total")
    case $rc in
    0) killed=$((killed + 1))
       printf '%-8s killed    %-32s by %s (%d s)\n' "$tag" "${names[$i]}" "$how" "$secs" ;;
    1) survived=$((survived + 1)) survivors="$survivors ${names[$i]}"
       printf '%-8s SURVIVED  %-32s %s: %s (%d s)\n' "$tag" "${names[$i]}" "${files[$i]}" "${whys[$i]}" "$secs" ;;
    3) stale=$((stale + 1))
       printf '%-8s STALE     %-32s %s (update tests/mutants.txt)\n' "$tag" "${names[$i]}" "$how" ;;
    4) broken=$((broken + 1))
       printf '%-8s BROKEN    %-32s %s (%s)\n' "$tag" "${names[$i]}" "$how" "$logs/${names[$i]}.log" ;;
    esac
done
m=$((killed + survived))
extra=""
[ $stale -gt 0 ] && extra="$extra, $stale stale"
[ $broken -gt 0 ] && extra="$extra, $broken not building"
echo "mutation-check: $killed of $m mutants killed${extra:+ (not counted:${extra#,})} in $(( ($(date +%s) - started) / 60 )) min"
[ -n "$survivors" ] && echo "mutation-check: survivors:$survivors (logs in build/mutation/logs)"
exit 0
