#!/usr/bin/env bash
# layers_check.sh [BUILD]: checks that the library's folders form layers,
#     tensor < autograd < ops < nn,
# each using only the ones below it, so that no change can quietly make a
# cycle (a lower layer calling up into a higher one). Run by make test, after
# the Check suites, on the objects in BUILD (default: build).
#
# (a) Includes. Every #include "..." of tensor/, autograd/, ops/ and nn/,
#     resolved from the including file's folder (the library is compiled
#     without -I), must name a header of the file's own layer or of one
#     below it, or nabla.h. nn/ is built only on the public API: nabla.h and
#     its own headers; so is mpi/ (the optional nabla_mpi), on top.
# (b) Symbols. The nb_/nbi_ symbols an object of a layer leaves undefined
#     (calls, variables) must not be defined by an object of a layer above
#     it; and nn/ uses no nbi_ symbol of the layers below (only nabla.h's).
#     This catches what includes cannot: a function declared by hand. mpi/'s
#     objects (when make mpi has built them) use no nbi_ symbol either.
#
# Prints one line per violation and exits 1; otherwise prints
# "layers ok: tensor < autograd < ops < nn" (and "< mpi" when mpi/ is built).
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
layers=(tensor autograd ops nn)
bad=0

violation() {
    echo "layers: $*"
    bad=1
}

# ------------------------------------------------------------ (a) includes
# may_include LAYER HEADER: whether LAYER may include HEADER (a path from the
# repository root).
may_include() {
    local layer=$1 h=$2
    [ "$h" = nabla.h ] && return 0
    case $layer in
    tensor) [[ $h == tensor/* ]] ;;
    autograd) [[ $h == tensor/* || $h == autograd/* ]] ;;
    ops) [[ $h == tensor/* || $h == autograd/* || $h == ops/* ]] ;;
    nn) [[ $h == nn/* ]] ;;
    mpi) [[ $h == mpi/* ]] ;;
    esac
}

# A layer's files: its folder's, for nn/ those of its kinds too (nn/train,
# nn/formats, nn/text: see docs/api.md, "Layout"), and for ops/ its
# per-architecture kernels (ops/arch/mca.h, ops/arch/<arch>/).
layer_files() {
    local ext=$1 layer=$2
    case $layer in
    nn) ls nn/*."$ext" nn/*/*."$ext" 2>/dev/null ;;
    ops) ls ops/*."$ext" ops/arch/*."$ext" ops/arch/*/*."$ext" 2>/dev/null ;;
    *) ls "$layer"/*."$ext" 2>/dev/null ;;
    esac
}

for layer in "${layers[@]}" mpi; do
    for f in $(layer_files c "$layer") $(layer_files h "$layer"); do
        [ -e "$f" ] || continue
        while IFS= read -r inc; do
            h=$(realpath -m --relative-to=. "$(dirname "$f")/$inc")
            may_include "$layer" "$h" ||
                violation "$f includes \"$inc\" ($h): $layer/ may include only$(
                    case $layer in
                    tensor) echo " tensor/" ;; autograd) echo " tensor/, autograd/" ;;
                    ops) echo " tensor/, autograd/, ops/" ;; nn) echo " nn/" ;;
                    mpi) echo " mpi/" ;; esac) and nabla.h"
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
done

# ------------------------------------------------------------- (b) symbols
# (an object whose source is gone, left in BUILD by an older checkout, is not the library's)
objects() {
    (cd "$build" && layer_files o "$1") | while read -r o; do
        [ -e "${o%.o}.c" ] && echo "$build/$o"
    done
}
missing=0
for layer in "${layers[@]}"; do
    set -- $(objects "$layer")
    if [ ! -e "$1" ]; then
        echo "layers: no objects in $build/$layer/ (build the library first: make)"
        missing=1
    fi
done
[ "$missing" = 0 ] || exit 1

# "symbol object" lines: the global nb_/nbi_ symbols the layer's objects
# define (uppercase nm types; static functions are lowercase and invisible
# to other objects), or leave undefined.
defined() {
    nm -A -P --defined-only $(objects "$1") |
        awk '$3 ~ /^[A-TV-Z]$/ && $2 ~ /^nbi?_/ { sub(/:$/, "", $1); print $2, $1 }'
}
undefined() {
    nm -A -P -u $(objects "$1") | awk '$2 ~ /^nbi?_/ { sub(/:$/, "", $1); print $2, $1 }'
}

# check LAYER SYMBOLS WHY ABOVE...: LAYER's undefined symbols matching the
# regex SYMBOLS must not be defined in the ABOVE layers (WHY ends the line).
check() {
    local layer=$1 symbols=$2 why=$3
    shift 3
    local defs sym obj where
    defs=$(for above in "$@"; do defined "$above"; done)
    while read -r sym obj; do
        [[ $sym =~ $symbols ]] || continue
        where=$(awk -v s="$sym" '$1 == s { print $2; exit }' <<<"$defs")
        [ -z "$where" ] || violation "$obj uses $sym, defined in ${where#"$build"/} $why"
    done < <(undefined "$layer")
}

check tensor '^nbi?_' '(a layer above tensor/)' autograd ops nn
check autograd '^nbi?_' '(a layer above autograd/)' ops nn
check ops '^nbi?_' '(a layer above ops/)' nn
check nn '^nbi_' '(nn/ uses only the nb_ API of nabla.h)' tensor autograd ops
top=nn
if [ -e "$build/mpi/ddp.o" ]; then
    check mpi '^nbi_' '(mpi/ uses only the nb_ API of nabla.h)' tensor autograd ops nn
    top="nn < mpi"
fi

if [ "$bad" != 0 ]; then
    echo "layers: the folders must form layers tensor < autograd < ops < nn (see docs/api.md, \"Layout\")"
    exit 1
fi
echo "layers ok: tensor < autograd < ops < $top"
