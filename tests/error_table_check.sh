#!/bin/sh
# error_table_check.sh [FILE.md]: checks that the error messages quoted in the
# "Limits and errors" section of FILE.md (default: the repository's
# docs/errors.md, where that section is the whole page under its "# Limits
# and errors" title) still exist in the sources (tensor/ ops/ autograd/
# nn/ mpi/), so the tables cannot rot silently when a message is reworded.
# make error-table-check runs it.
#
# The section starts at a heading of any level whose text is "Limits and
# errors" and ends at the next heading of the same or a higher level; a file
# without such a section, or whose section holds no message table, fails
# (exit 1), so a moved or renamed page cannot pass by checking nothing.
#
# What is checked: in that section, every table whose last header cell
# contains "message"; in each row, the first `code span` of the last cell is
# the example message, e.g.
#     nb_matmul: shapes (2,3) and (4,5) cannot be multiplied (3 != 4)
# 1. A leading function name ("nb_matmul: ") must appear in the sources as
#    the start of a string literal ("nb_matmul" or "nb_matmul: ...).
# 2. The rest is cut into literal pieces at the values a format string fills
#    in (numbers, "quoted" and 'quoted' text, shapes (2,3), [0, 24], the
#    "(JSON, byte 5)" nn/formats/json.c appends to what it reports, dtype
#    names, nb_* names, NaN/Inf, and the words the tables use for a user's
#    own code: rmsnorm and split, names of custom functions, and boom, the
#    message their callbacks report) and at ": " and "; ", where messages are
#    joined from several format strings. Pieces of 8 or more characters are
#    candidates (7 in a message that has none that long: "is NULL"). Two
#    are checked: the first candidate of the message (its stable literal
#    prefix) and the first candidate of its last ": " part
#    (the specific reason in a composed message such as nb_load's).
# 3. A piece passes when it occurs in the sources, written as in a C string
#    (\ and " escaped; string literals continued on the next line are
#    joined first); or does with its first or last word replaced by %s (5
#    characters or more left), or several of its first words (16 or more
#    left): words a %s filled in, as "weight" in "weight must have shape" or
#    "a tensor could not be read" before " (the previous file ...)". A piece
#    that starts with a capital letter is text from outside (strerror's "Is a
#    directory (the previous file ...)", "MISMATCH"): it also passes when
#    what follows some of its leading words occurs (8 characters or more),
#    and when nothing does it is taken to be a value and the next candidate
#    is used.
# ERROR_TABLE_CHECK_VERBOSE=1 lists the pieces checked for every row.
# Prints each failing row (line, example, the piece not found) and exits 1;
# exits 0 when every example is found, 2 on a usage error.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
md=${1:-$root/docs/errors.md}
if [ ! -r "$md" ]; then
    echo "error_table_check: cannot read $md" >&2
    exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/error_table_check.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 2' HUP INT TERM

# The sources, with a string literal that ends a line and one that starts
# the next line joined ("... in the "\n "registry" -> "... in the registry").
for f in "$root"/tensor/*.[ch] "$root"/ops/*.[ch] "$root"/autograd/*.[ch] "$root"/nn/*.[ch] "$root"/nn/*/*.[ch] "$root"/mpi/*.[ch]; do
    [ -f "$f" ] || continue
    awk '
        have && prev ~ /"[ \t]*$/ && $0 ~ /^[ \t]*"/ {
            sub(/"[ \t]*$/, "", prev)
            line = $0
            sub(/^[ \t]*"/, "", line)
            prev = prev line
            next
        }
        { if (have) print prev; prev = $0; have = 1 }
        END { if (have) print prev }
    ' "$f"
done >"$tmp/sources"
if [ ! -s "$tmp/sources" ]; then
    echo "error_table_check: no sources found under $root" >&2
    exit 2
fi

# The plan: one X line per example, an F line for its function name, then
# P lines (role TAB piece) for the candidate pieces.
awk '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
    # the literal pieces of s, in order, into pc[1..n]; part[k] is the index
    # of the ": "-separated part piece k belongs to
    function pieces(s,    n, p, rest, vre, cut, sep, parts) {
        vre = "\"[^\"]*\"|\047[^\047]*\047|\\(-?[0-9]*(,-?[0-9]+)*\\)|\\[[0-9, ]*]|" \
              "\\(JSON, byte [0-9]+\\)|" \
              "nb_[A-Za-z0-9_]+|-?(NaN|nan|Inf|inf)|(f32|f64|i64|bool|F32|F64|I64|BOOL)|" \
              "-?[0-9]+([.][0-9]+)?(e[-+]?[0-9]+)?|rmsnorm|split|boom"
        n = 0; parts = 1
        rest = s
        while (rest != "") {
            cut = length(rest) + 1; sep = 0
            if (match(rest, vre)) { cut = RSTART; sep = RLENGTH }
            if (match(rest, /: |; /) && RSTART < cut) {
                cut = RSTART; sep = RLENGTH
                p = trim(substr(rest, 1, cut - 1))
                if (p != "") { pc[++n] = p; part[n] = parts }
                if (substr(rest, cut, 1) == ":") parts++
                rest = substr(rest, cut + sep)
                continue
            }
            p = trim(substr(rest, 1, cut - 1))
            if (p != "") { pc[++n] = p; part[n] = parts }
            rest = substr(rest, cut + sep)
        }
        nparts = parts
        return n
    }
    /^#+ / {
        level = index($0, " ") - 1
        if ($0 ~ /^#+ Limits and errors[ \t]*$/) { insec = 1; seclevel = level }
        else if (insec && level <= seclevel) insec = 0
        intable = 0
        next
    }
    !insec { next }
    !/^[ \t]*\|/ { intable = 0; next }
    {
        line = $0
        gsub(/\\\|/, "\001", line)        # an escaped | inside a cell
        sub(/^[ \t]*\|/, "", line)
        sub(/\|[ \t]*$/, "", line)
        nc = split(line, cell, "|")
        last = cell[nc]
        if (!intable) {                     # the header row
            intable = 1
            check = (tolower(last) ~ /message/)
            next
        }
        if (last ~ /^[ \t:-]+$/) next       # the separator row
        if (!check || !match(last, /`[^`]*`/)) next
        ex = substr(last, RSTART + 1, RLENGTH - 2)
        gsub(/\001/, "|", ex)
        print "X\t" NR "\t" ex
        body = ex
        if (match(body, /^nb_[A-Za-z0-9_]+: /)) {
            print "F\t" NR "\t" substr(body, 1, RLENGTH - 2)
            body = substr(body, RLENGTH + 1)
        }
        n = pieces(body)
        min = 7                             # 8, unless the message has no such piece
        for (k = 1; k <= n; k++) if (length(pc[k]) >= 8) min = 8
        for (k = 1; k <= n; k++)
            if (length(pc[k]) >= min) print "P\t" NR "\tfirst\t" pc[k]
        for (k = 1; k <= n; k++)
            if (length(pc[k]) >= min && part[k] == nparts) print "P\t" NR "\tlast\t" pc[k]
    }
' "$md" >"$tmp/plan"

# found TEXT: does TEXT, written as inside a C string, occur in the sources?
found() {
    c=$(printf '%s\n' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')
    grep -F -q -e "$c" "$tmp/sources"
}

# piece_ok PIECE: 0 found, 1 not found, 2 not found but a value (capitalized)
piece_ok() {
    found "$1" && return 0
    case $1 in
    *" "*)
        p=${1#* } # the first word filled in by %s
        [ "${#p}" -ge 5 ] && found "%s $p" && return 0
        p=${1% *} # the last one
        [ "${#p}" -ge 5 ] && found "$p %s" && return 0
        p=${1#* } q=$1 # several leading words
        while [ "$p" != "$q" ]; do
            q=$p p=${p#* }
            [ "${#p}" -ge 16 ] || break
            found "%s $p" && return 0
        done
        ;;
    esac
    case $1 in
    [A-Z]*) ;;
    *) return 1 ;;
    esac
    p=$1 # capitalized: text from outside, as strerror's "Is a directory (...)"
    while case $p in *" "*) true ;; *) false ;; esac; do
        p=${p#* }
        [ "${#p}" -ge 8 ] || break
        found "$p" && return 0
    done
    return 2
}

verbose=${ERROR_TABLE_CHECK_VERBOSE:-}
tab=$(printf '\t')
rows=0
failed=0
cur=""
state=""      # for the current row: "" undecided, or "fail"
first_done=0
last_done=0
checked_any=0

finish_row() {
    [ -n "$cur" ] || return 0
    if [ "$state" != fail ] && [ "$checked_any" = 0 ]; then
        state=fail
        why="no literal text of 7 or more characters to look for"
    fi
    if [ "$state" = fail ]; then
        failed=$((failed + 1))
        printf '%s:%s: %s\n    not in the sources: %s\n' "$md" "$cur" "$example" "$why"
    fi
}

while IFS="$tab" read -r kind line a b; do
    case $kind in
    X)
        finish_row
        rows=$((rows + 1))
        cur=$line example=$a state="" first_done=0 last_done=0 checked_any=0 why=""
        ;;
    F)
        if [ "$state" != fail ] && ! grep -F -q -e "\"$a\"" -e "\"$a:" "$tmp/sources"; then
            state=fail
            why="the function name \"$a\""
        fi
        ;;
    P)
        [ "$state" = fail ] && continue
        if [ "$a" = first ]; then
            [ "$first_done" = 1 ] && continue
        else
            [ "$last_done" = 1 ] && continue
        fi
        piece_ok "$b"
        rc=$?
        [ "$rc" = 2 ] && continue
        if [ "$rc" = 0 ]; then
            checked_any=1
            [ -n "$verbose" ] && printf '%s: %s piece "%s"\n' "$line" "$a" "$b"
        else
            state=fail
            why="\"$b\""
        fi
        if [ "$a" = first ]; then first_done=1; else last_done=1; fi
        ;;
    esac
done <"$tmp/plan"
finish_row

if [ "$rows" = 0 ]; then
    echo "error_table_check: no message examples found in a \"Limits and errors\" section of $md" >&2
    exit 1
fi
if [ "$failed" -gt 0 ]; then
    echo "error_table_check: $failed of $rows messages in $md are not in the sources"
    exit 1
fi
echo "error_table_check: all $rows messages in $md are in the sources"
exit 0
