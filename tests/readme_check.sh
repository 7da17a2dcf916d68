#!/bin/sh
# readme_check.sh BUILD FILE.md...: the documentation's programs and links
# still work (make readme-check runs it on README.md and docs/*.md).
#
# 1. Programs. A ```c block whose first line is "/* name.c: ..." is a
#    complete program: it is extracted to BUILD/readme/name.c, compiled with
#    $CC $CFLAGS -I. against BUILD/libnabla.a ($LDLIBS) and run. When a
#    ```text block follows it (before the next program) and does not start
#    with "$ ", the program's output must be exactly that text. Program
#    names are unique across all the files: a second name.c is an error
#    naming both files.
# 2. Commands. A ```text block whose first line is "$ build/examples/..." is
#    run as that command (with build/ replaced by BUILD/) and its output must
#    be the rest of the block.
# 3. Links. Every relative link target, [text](path) or ![alt](path), outside
#    code, must exist, relative to the file that holds it; a "#anchor" into a
#    .md file must name one of its headings (GitHub's anchors: lowercase,
#    punctuation dropped, spaces to hyphens).
# Prints one line per program and command checked, and a summary of links;
# exits 1 at the first failure, 2 on a usage error.
set -u

if [ $# -lt 2 ]; then
    echo "usage: readme_check.sh BUILD FILE.md..." >&2
    exit 2
fi
build=$1
shift
for md in "$@"; do
    [ -r "$md" ] || { echo "readme-check: cannot read $md" >&2; exit 2; }
done
: "${CC:=cc}"
: "${CFLAGS:=}"
: "${LDLIBS:=-lm -lpthread}"

out=$build/readme
rm -rf "$out" && mkdir -p "$out" || exit 2

# ---------------------------------------------------------------- extraction
# name.c, name.expected and name.from (the file it came from); runN.cmd,
# runN.expected and runN.from for the commands.
awk -v dir="$out" '
    function done_block() {
        if (f != "") close(f)
        if (t != "") close(t)
        on = 0; txt = 0; f = ""; t = ""
    }
    FNR == 1 { done_block(); cur = ""; cmd = 0 }
    /^```c$/ {
        getline
        if ($0 ~ /^\/\* [a-z_0-9]+\.c:/) {
            split($2, n, ":")
            if (n[1] in from) {
                printf "readme-check: program %s appears twice: in %s and in %s; names must be unique\n", \
                    n[1], from[n[1]], FILENAME
                bad = 1
                exit 1
            }
            from[n[1]] = FILENAME
            f = dir "/" n[1]
            base = f
            sub(/\.c$/, "", base)
            cur = base ".expected"
            print FILENAME > (base ".from")
            close(base ".from")
            print > f
            on = 1
        }
        next
    }
    /^```text$/ {
        getline
        if ($0 ~ /^\$ build\/examples\//) {
            runs++
            r = dir "/run" runs
            line = $0
            sub(/^\$ /, "", line)
            print line > (r ".cmd")
            close(r ".cmd")
            print FILENAME > (r ".from")
            close(r ".from")
            t = r ".expected"
            printf "" > t
            cmd = 1
            next
        }
        if ($0 ~ /^\$ /) { cur = ""; next }
        if (cur != "") { t = cur; printf "" > t; txt = 1; print > t }
        next
    }
    /^```$/ { if (txt) cur = ""; done_block(); cmd = 0; next }
    on { print > f }
    txt || cmd { print > t }
    END { exit bad }
' "$@" || exit 1

# ------------------------------------------------------- programs, commands
for f in "$out"/*.c; do
    [ -e "$f" ] || continue
    b=${f%.c}
    name=$(basename "$f")
    md=$(cat "$b.from")
    $CC $CFLAGS -I. "$f" "$build/libnabla.a" $LDLIBS -o "$b" || {
        echo "readme-check: $md: program $name does not compile"
        exit 1
    }
    "$b" >"$b.out" || { echo "readme-check: $md: program $name failed (exit status $?)"; exit 1; }
    if [ -f "$b.expected" ]; then
        diff -u "$b.expected" "$b.out" || {
            echo "readme-check: $md: program $name: output differs from the one shown"
            exit 1
        }
        echo "$md program $name: compiled and ran; output as shown ($(wc -l <"$b.out") lines)"
    else
        echo "$md program $name: compiled and ran; first line: $(head -1 "$b.out")"
    fi
done
for c in "$out"/run*.cmd; do
    [ -e "$c" ] || continue
    r=${c%.cmd}
    md=$(cat "$r.from")
    shown=$(cat "$c")
    sed "s|^build/|$build/|" "$c" >"$r.sh"
    sh "$r.sh" >"$r.out" || { echo "readme-check: $md: command $shown failed"; exit 1; }
    diff -u "$r.expected" "$r.out" || {
        echo "readme-check: $md: the output of $shown differs from the one shown"
        exit 1
    }
    echo "$md command $shown: output as shown ($(wc -l <"$r.out") lines)"
done

# -------------------------------------------------------------------- links
# Headings' anchors of every .md file linked to, then every link checked.
nlinks=0
bad=0
for md in "$@"; do
    d=$(dirname "$md")
    # =target TAB =anchor, one line per relative link outside code
    awk '
        /^```/ { code = !code; next }
        code { next }
        {
            s = $0
            gsub(/`[^`]*`/, "", s)
            while (match(s, /\]\([^) \t]+\)/)) {
                l = substr(s, RSTART + 2, RLENGTH - 3)
                s = substr(s, RSTART + RLENGTH)
                if (l ~ /^[a-z]+:/) continue
                a = ""
                if (index(l, "#")) { a = substr(l, index(l, "#") + 1); l = substr(l, 1, index(l, "#") - 1) }
                print "=" l "\t=" a   # "=": no field is empty (read drops empty ones)
            }
        }
    ' "$md" >"$out/links" || exit 2
    while IFS="$(printf '\t')" read -r target anchor; do
        target=${target#=} anchor=${anchor#=}
        nlinks=$((nlinks + 1))
        if [ -z "$target" ]; then
            path=$md
        else
            path=$d/$target
        fi
        if [ ! -e "$path" ]; then
            echo "readme-check: $md: broken link: $target (no file $path)"
            bad=$((bad + 1))
            continue
        fi
        [ -n "$anchor" ] || continue
        case $path in *.md) ;; *) continue ;; esac
        if ! awk -v want="$anchor" '
            /^```/ { code = !code; next }
            code || !/^#+ / { next }
            {
                h = $0
                sub(/^#+ +/, "", h)
                h = tolower(h)
                gsub(/[^a-z0-9 _-]/, "", h)
                gsub(/ /, "-", h)
                if (h == want) found = 1
            }
            END { exit !found }
        ' "$path"; then
            echo "readme-check: $md: broken link: $target#$anchor (no such heading in $path)"
            bad=$((bad + 1))
        fi
    done <"$out/links"
done
if [ "$bad" -gt 0 ]; then
    echo "readme-check: $bad of $nlinks relative links are broken"
    exit 1
fi
echo "readme-check: all $nlinks relative links in $# files point to existing files and headings"
