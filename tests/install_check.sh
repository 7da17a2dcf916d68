#!/usr/bin/env bash
# install_check.sh: installs nabla into a temporary prefix, builds a program
# outside the tree against it through pkg-config (shared, then static), runs
# both, and checks that make uninstall takes back every file. Also `make install-check`.
set -euo pipefail
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
CC=${CC:-cc}
# Only PREFIX/DESTDIR given below may decide where files go.
unset DESTDIR LIBDIR INCLUDEDIR PKGCONFIGDIR

fail() { echo "install-check: FAIL: $*" >&2; exit 1; }
step() { echo "install-check: $*"; }

command -v pkg-config >/dev/null || fail "pkg-config is not installed (apt-get install pkg-config)"
command -v readelf >/dev/null || fail "readelf is not installed (apt-get install binutils)"

part() { awk -v m="NB_VERSION_$1" '$2 == m {print $3; exit}' nabla.h; }
major=$(part MAJOR)
version=$major.$(part MINOR).$(part PATCH)
# the soname's version: the major, or 0.MINOR while the major is 0 (Makefile)
if [ "$major" = 0 ]; then major=0.$(part MINOR); fi
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "cannot read the version from nabla.h (got '$version')"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
mkdir "$prefix"

# ---------------------------------------------------------------- install
step "make install PREFIX=$prefix"
$MAKE --no-print-directory install PREFIX="$prefix" > "$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "make install PREFIX=$prefix failed"; }

for f in include/nabla.h lib/libnabla.a "lib/libnabla.so.$version" lib/pkgconfig/nabla.pc; do
    [ -f "$prefix/$f" ] && [ ! -L "$prefix/$f" ] || fail "make install did not install $f"
done
for f in include/nabla.h lib/libnabla.a lib/pkgconfig/nabla.pc; do
    [ "$(stat -c %a "$prefix/$f")" = 644 ] || fail "$f has mode $(stat -c %a "$prefix/$f"), expected 644"
done
[ "$(stat -c %a "$prefix/lib/libnabla.so.$version")" = 755 ] || fail "libnabla.so.$version is not mode 755"
[ "$(readlink "$prefix/lib/libnabla.so.$major")" = "libnabla.so.$version" ] ||
    fail "lib/libnabla.so.$major is not a symlink to libnabla.so.$version"
[ "$(readlink "$prefix/lib/libnabla.so")" = "libnabla.so.$major" ] ||
    fail "lib/libnabla.so is not a symlink to libnabla.so.$major"
soname=$(readelf -d "$prefix/lib/libnabla.so.$version" | grep SONAME || true)
[[ $soname == *"[libnabla.so.$major]"* ]] || fail "installed library has SONAME '$soname', expected libnabla.so.$major"
! grep -q @ "$prefix/lib/pkgconfig/nabla.pc" || fail "nabla.pc has unsubstituted @...@ fields"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion nabla)" = "$version" ] ||
    fail "pkg-config --modversion nabla says '$(pkg-config --modversion nabla)', expected $version"

# ---------------------------------------------------- a program outside the tree
cat > "$tmp/prog.c" <<'EOF'
/* sum(a @ b) for a = [[1,2],[3,4]], b = [[5,6],[7,8]]: 134, and d/da = [[11,15],[11,15]]. */
#include <nabla.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    const float av[] = {1, 2, 3, 4}, bv[] = {5, 6, 7, 8};
    nb_scope_begin();
    nb_tensor *a = nb_set_requires_grad(nb_from_data(NB_F32, NB_SHAPE(2, 2), av), true);
    nb_tensor *b = nb_from_data(NB_F32, NB_SHAPE(2, 2), bv);
    nb_tensor *y = nb_sum_all(nb_matmul(a, b));
    double g[4];
    if (!y || nb_backward(y) != 0 || nb_copy_to_f64(nb_grad(a), g) != 0) {
        fprintf(stderr, "prog: %s\n", nb_last_error());
        return 1;
    }
    double sum = nb_item(y);
    printf("sum %g grad %g %g %g %g version %s\n", sum, g[0], g[1], g[2], g[3], nb_version());
    nb_scope_end();
    int ok = sum == 134 && g[0] == 11 && g[1] == 15 && g[2] == 11 && g[3] == 15 &&
             strcmp(nb_version(), NB_VERSION_STRING) == 0;
    if (!ok) fprintf(stderr, "prog: wrong result\n");
    return ok ? 0 : 1;
}
EOF
expected="sum 134 grad 11 15 11 15 version $version"

# Shared: the program must record the soname and run from the prefix.
step "cc prog.c \$(pkg-config --cflags --libs nabla)"
(cd "$tmp" && $CC prog.c $(pkg-config --cflags --libs nabla) -o prog) ||
    fail "building a program with 'pkg-config --cflags --libs nabla' failed"
needed=$(readelf -d "$tmp/prog" | grep NEEDED || true)
[[ $needed == *"[libnabla.so.$major]"* ]] || fail "prog does not need libnabla.so.$major; readelf -d says: $needed"
if command -v ldd >/dev/null; then
    # captured first: grep -q closing the pipe early would fail ldd with
    # SIGPIPE, and the pipeline with it under pipefail (a flaky failure)
    resolved=$(LD_LIBRARY_PATH=$prefix/lib ldd "$tmp/prog")
    [[ $resolved == *"libnabla.so.$major => $prefix/lib/libnabla.so.$major"* ]] ||
        fail "ldd does not resolve libnabla.so.$major into $prefix/lib"
fi
out=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/prog") || fail "prog (shared) exited with an error; output: $out"
[ "$out" = "$expected" ] || fail "prog (shared) printed '$out', expected '$expected'"
step "shared prog: $out"

# Static: pkg-config --static adds Libs.private (-lm -lpthread); -l:libnabla.a
# makes the linker take the archive although libnabla.so sits beside it.
flags=()
for f in $(pkg-config --static --cflags --libs nabla); do
    [ "$f" = -lnabla ] && f=-l:libnabla.a
    flags+=("$f")
done
step "cc prog.c ${flags[*]}"
(cd "$tmp" && $CC prog.c "${flags[@]}" -o prog_static) ||
    fail "building a program statically against libnabla.a with 'pkg-config --static' failed"
! readelf -d "$tmp/prog_static" | grep -q 'NEEDED.*libnabla' || fail "prog_static still needs libnabla.so"
out=$(env -u LD_LIBRARY_PATH "$tmp/prog_static") || fail "prog (static) exited with an error; output: $out"
[ "$out" = "$expected" ] || fail "prog (static) printed '$out', expected '$expected'"
step "static prog: $out"

# -------------------------------------------------------------- uninstall
step "make uninstall PREFIX=$prefix"
$MAKE --no-print-directory uninstall PREFIX="$prefix" > "$tmp/uninstall.log" 2>&1 ||
    { cat "$tmp/uninstall.log" >&2; fail "make uninstall PREFIX=$prefix failed"; }
left=$(find "$prefix" -type f -o -type l)
[ -z "$left" ] || fail "make uninstall left files behind: $left"

# ----------------------------- DESTDIR staging, LIBDIR, and nothing else removed
stage=$tmp/stage
mkdir -p "$stage/opt/nabla/lib64/pkgconfig"
echo keep > "$stage/opt/nabla/lib64/pkgconfig/other.pc"
step "make install DESTDIR=$stage PREFIX=/opt/nabla LIBDIR=/opt/nabla/lib64"
$MAKE --no-print-directory install DESTDIR="$stage" PREFIX=/opt/nabla LIBDIR=/opt/nabla/lib64 > "$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "make install with DESTDIR failed"; }
for f in include/nabla.h lib64/libnabla.a "lib64/libnabla.so.$version" "lib64/libnabla.so.$major" \
         lib64/libnabla.so lib64/pkgconfig/nabla.pc; do
    [ -e "$stage/opt/nabla/$f" ] || fail "make install DESTDIR=... did not install /opt/nabla/$f under DESTDIR"
done
grep -qx 'prefix=/opt/nabla' "$stage/opt/nabla/lib64/pkgconfig/nabla.pc" &&
    grep -qx 'libdir=${prefix}/lib64' "$stage/opt/nabla/lib64/pkgconfig/nabla.pc" ||
    fail "nabla.pc under DESTDIR does not record prefix=/opt/nabla and libdir=\${prefix}/lib64"
$MAKE --no-print-directory uninstall DESTDIR="$stage" PREFIX=/opt/nabla LIBDIR=/opt/nabla/lib64 > "$tmp/uninstall.log" 2>&1 ||
    { cat "$tmp/uninstall.log" >&2; fail "make uninstall with DESTDIR failed"; }
left=$(find "$stage" -type f -o -type l)
[ "$left" = "$stage/opt/nabla/lib64/pkgconfig/other.pc" ] ||
    fail "make uninstall DESTDIR=... should leave only the unrelated other.pc; found: $left"

step "OK (nabla $version installs, links shared and static through pkg-config, uninstalls cleanly)"
