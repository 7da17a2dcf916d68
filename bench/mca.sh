#!/bin/bash
# bench/mca.sh: make mca. Estimates the micro-kernels' speed on CPU models we
# do not have, with LLVM's machine-code analyser (llvm-mca).
#
# Every library source that has LLVM-MCA marks (ops/arch/mca.h's
# NBI_MCA_BEGIN/END, found by grep, in the .c or in a header it includes) is
# compiled to assembly with -DNB_MCA and the command the Makefile builds its
# object with (make -n, so per-object flags come along): sources under
# ops/arch/<arm|aarch64>/ with the aarch64 cross compiler, those under
# ops/arch/x86/ with the build's compiler, the others with both. Each marked
# region is cut out of the assembly (with the loop's counter and back branch
# when they follow the END mark), and run through llvm-mca on each CPU model.
#
# The peak is measured the same way: llvm-mca on a generated loop of
# independent instructions of the kernel's own kind and width (vfmadd231ps
# zmm, fmla v.4s, bfmmla ...), the model's resource bound (Block
# RThroughput). The share is then the model's own: kernel FMAs per cycle over
# the model's FMAs per cycle. Kernels under 85% of it are flagged.
#
# Usage: bench/mca.sh BUILD_DIR   (the Makefile passes MAKE, CC)
# Environment: MCA (llvm-mca-16), CROSS (aarch64-linux-gnu-gcc), MCA_ITER
# (iterations, 300), MCA_X86_CPUS, MCA_A64_CPUS (space-separated models),
# MCA_CLANG=1 (also clang, for x86-64 and --target=aarch64-linux-gnu).
set -u
BUILD=${1:-build}
MAKE=${MAKE:-make}
CC=${CC:-cc}
MCA=${MCA:-llvm-mca-16}
CROSS=${CROSS:-aarch64-linux-gnu-gcc}
ITER=${MCA_ITER:-300}
X86_CPUS=${MCA_X86_CPUS:-znver3 znver4 sapphirerapids}
A64_CPUS=${MCA_A64_CPUS:-neoverse-n1 neoverse-n2 neoverse-v1 neoverse-v2 apple-m1 cortex-a76 cortex-a78}
OUT=$BUILD/mca
MEASURED=bench/mca_measured.txt

die() { echo "make mca: $*" >&2; exit 1; }
command -v "$MCA" >/dev/null 2>&1 || die "$MCA not found (Debian: apt-get install llvm-16)"
case $("$CC" -dumpmachine 2>/dev/null) in
  aarch64*) ;;
  *) command -v "$CROSS" >/dev/null 2>&1 || die "$CROSS not found (Debian: apt-get install gcc-aarch64-linux-gnu)" ;;
esac
[ -f ops/arch/mca.h ] || die "run from the top of the source tree (ops/arch/mca.h not found)"
rm -rf "$OUT" && mkdir -p "$OUT" || die "cannot create $OUT"

# ------------------------------------------------------------ the sources
# .c files with marks, and those including a header with marks.
srcs=$(find tensor ops autograd nn -name '*.c' | LC_ALL=C sort)
marked=""
for f in $(grep -l 'NBI_MCA_BEGIN' $(find tensor ops autograd nn -name '*.[ch]') 2>/dev/null | LC_ALL=C sort); do
  case $f in
    ops/arch/mca.h) ;;
    *.c) marked="$marked $f" ;;
    *.h) h=${f##*/}; marked="$marked $(grep -l "#include \"[^\"]*$h\"" $srcs)" ;;
  esac
done
marked=$(printf '%s\n' $marked | LC_ALL=C sort -u)
[ -n "$marked" ] || die "no source has LLVM-MCA marks (NBI_MCA_BEGIN, ops/arch/mca.h)"

# compilers: "arch tag compiler" lines. On an x86-64 host the build's CC and
# the aarch64 cross compiler; on an aarch64 host the build's CC and, when
# installed, x86_64-linux-gnu-gcc.
case $("$CC" --version 2>/dev/null | head -1) in *clang*) cctag=clang ;; *) cctag=gcc ;; esac
case $("$CC" -dumpmachine 2>/dev/null) in
  x86_64*) compilers="x86_64 $cctag $CC
aarch64 gcc $CROSS" ;;
  aarch64*) compilers="aarch64 $cctag $CC"
    command -v x86_64-linux-gnu-gcc >/dev/null 2>&1 && compilers="$compilers
x86_64 gcc x86_64-linux-gnu-gcc" ;;
  *) die "CC=$CC targets $("$CC" -dumpmachine 2>/dev/null): make mca knows x86-64 and aarch64 hosts" ;;
esac
if [ "${MCA_CLANG:-0}" = 1 ]; then
  command -v clang >/dev/null 2>&1 || die "MCA_CLANG=1: clang not found"
  compilers="$compilers
x86_64 clang clang --target=x86_64-linux-gnu
aarch64 clang clang --target=aarch64-linux-gnu"
fi

# The arch a source is compiled for: ops/arch/<dir>/ names it, else both.
src_arches() {
  case $1 in
    ops/arch/arm/* | ops/arch/aarch64/* | ops/arch/arm64/*) echo aarch64 ;;
    ops/arch/x86/* | ops/arch/x86_64/*) echo x86_64 ;;
    ops/arch/*) echo "" ;;
    *) echo "x86_64 aarch64" ;;
  esac
}

# The Makefile's command for SRC's object with compiler CCX, as an -S -DNB_MCA one.
mca_command() { # src ccx out.s
  local src=$1 ccx=$2 out=$3 obj line
  obj=$OUT/obj/${src%.c}.o
  line=$(MAKEFLAGS= MAKELEVEL= $MAKE --no-print-directory -n -B BUILD="$OUT/obj" CC="$ccx" "$obj" 2>/dev/null |
         grep -F -- " -c $src " | tail -1)
  [ -n "$line" ] || return 1
  printf '%s\n' "$line" | sed "s# -c $src -o [^ ]*# -DNB_MCA -S $src -o $out#"
}

# Names of the marked regions SRC has for a compiler (its preprocessed text:
# `"# LLVM-MCA-BEGIN " "gemm_" "f32_avx512"` joined up).
region_names() { # cmdline out.i
  eval "$(printf '%s' "$1" | sed "s# -S # -E #; s# -o [^ ]*# -o $2#")" 2> "$2.log" || return 1
  grep -o '"# LLVM-MCA-BEGIN "[^)]*)' "$2" | sed 's/" *"//g; s/^"# LLVM-MCA-BEGIN //; s/").*//' | LC_ALL=C sort -u
}

# ------------------------------------------------------------ compile
echo "make mca: llvm-mca ($($MCA --version 2>/dev/null | sed -n 's/^.*LLVM version /LLVM /p' | head -1)) on the marked micro-kernel loops; the build's flags + -DNB_MCA -S"
jobs_list=""
n=0
while read -r arch tag ccx; do
  for src in $marked; do
    case " $(src_arches "$src") " in *" $arch "*) ;; *) continue ;; esac
    n=$((n + 1))
    base=$OUT/$arch-$tag/${src%.c}
    mkdir -p "$(dirname "$base")"
    cmd=$(mca_command "$src" "$ccx" "$base.s") || die "make -n printed no compile command for $src with CC=$ccx"
    names=$(region_names "$cmd" "$base.i") || { cat "$base.i.log" >&2; die "preprocessing $src for $arch failed"; }
    [ -n "$names" ] || continue # its marks are for the other architecture
    printf '%s\n' "$names" > "$base.names"
    printf '%s\n' "$cmd" > "$base.cmd"
    echo "  $cmd"
    ( eval "$cmd" > "$base.log" 2>&1 || { echo fail > "$base.failed"; } ) &
    jobs_list="$jobs_list $arch $tag $src $base"
  done
done <<EOF
$compilers
EOF
wait
set -- $jobs_list
while [ $# -ge 4 ]; do
  [ -f "$4.failed" ] && { cat "$4.log" >&2; die "compiling $3 for $1 with $2 failed (command in $4.cmd)"; }
  shift 4
done

# ------------------------------------------------------------ regions
# Cut each BEGIN..END out of the .s: instructions only (no directives, labels,
# comments), plus the loop's tail (counter, compare, branch) when a branch to
# the label right before BEGIN follows END within 8 instructions. Prints
# "name function file ninsn backbranch" per region and writes the files.
extract() { # file.s dir arch
  awk -v dir="$2" -v arch="$3" '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
    function is_insn(s) { s = trim(s); return s != "" && s !~ /^[.#\/@]/ && s !~ /^[^ \t]*:$/ }
    function is_label(s) { return s ~ /^[A-Za-z_.$][A-Za-z0-9_.$]*:/ }
    function is_branch(s) { return s ~ /^(j[a-z]+|jmp|b|b\.[a-z]+|b(eq|ne|cs|cc|hs|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le)|cbn?z|tbn?z)[ \t]/ }
    function debug_label(s) { return s ~ /^\.L/ && s !~ /^\.L[0-9]+:/ && s !~ /^\.LBB[0-9]+_[0-9]+:/ } # gcc .L12, clang .LBB3_4: code
    function flush(   f) {
      f = dir "/" name (count[name] > 1 ? "." count[name] : "") ".s"
      printf "%s", body > f; if (tail_ok) printf "%s", tail > f; close(f)
      printf "%s %s %s %d %s %d\n", name (count[name] > 1 ? "." count[name] : ""), fn, f, ninsn + (tail_ok ? ntail : 0), tail_ok ? "yes" : "no", nbr
    }
    {
      line = $0; sub(/\r$/, "", line)
      if (line ~ /LLVM-MCA-BEGIN /) {
        if (state == 1) { print "ERROR nested BEGIN " $NF " inside " name; exit 1 }
        if (state == 2) { tail_ok = 0; flush(); state = 0 }
        name = $NF; count[name]++; state = 1; body = ""; ninsn = 0; nbr = 0; loop = looplabel; next
      }
      if (line ~ /LLVM-MCA-END /) {
        if (state != 1 || $NF != name) { print "ERROR END " $NF " without its BEGIN"; exit 1 }
        state = 2; tail = ""; ntail = 0; tail_ok = 0
        if (loop == "") { flush(); state = 0 }
        next
      }
      if (is_label(line)) {
        lab = line; sub(/:.*/, "", lab)
        if (lab !~ /^\./ && state == 0) fn = lab
        if (!debug_label(line)) {
          if (state == 1) nbr++ # a label inside: a loop or a branch target
          if (state == 2) { flush(); state = 0 }
          looplabel = lab
        }
        next
      }
      if (!is_insn(line)) next
      ins = trim(line) # a comment off; on aarch64 "#" is an immediate ([x7, #1, mul vl]), not one
      if (arch == "aarch64") sub(/[ \t]*\/\/.*$/, "", ins); else sub(/[ \t]*(\/\/|#).*$/, "", ins)
      if (state == 0) { looplabel = ""; next }
      if (state == 1) { body = body "\t" ins "\n"; ninsn++; if (is_branch(ins)) nbr++; next }
      # state 2: the tail after END
      tail = tail "\t" ins "\n"; ntail++
      n = split(ins, w, /[ \t,]+/)
      if (w[n] == loop) { tail_ok = 1; flush(); state = 0 }
      else if (is_branch(ins) || ins ~ /^ret/ || ntail >= 8) { flush(); state = 0 }
    }
    END { if (state == 1) { print "ERROR BEGIN " name " without its END"; exit 1 } if (state == 2) flush() }
  ' "$1"
}

regions=$OUT/regions.txt
: > "$regions"
set -- $jobs_list
while [ $# -ge 4 ]; do
  arch=$1 tag=$2 src=$3 base=$4; shift 4
  dir=$base.regions
  mkdir -p "$dir"
  ex=$(extract "$base.s" "$dir" "$arch") || die "$src ($arch, $tag): $(printf '%s\n' "$ex" | grep ERROR | head -1)"
  for nm in $(cat "$base.names"); do
    printf '%s\n' "$ex" | awk -v n="$nm" '$1 == n || index($1, n ".") == 1 { f = 1 } END { exit !f }' ||
      die "$src ($arch, $tag): the marked region $nm is missing from the assembly ($base.s): the compiler dropped or never emitted its loop"
  done
  printf '%s\n' "$ex" | awk -v p="$arch $tag $src" '$4 == 0 { exit 1 } { print p, $0 }' >> "$regions" ||
    die "$src ($arch, $tag): a marked region has no instruction (see $dir)"
done

# ------------------------------------------------------------ kinds, peaks
# The kernel's work instruction: its kind (the most frequent one), the count
# per iteration and a peak template ({i}: the accumulator number).
kind_of() { # file arch -> "kind count"
  awk -v arch="$2" '
    { m = $1; dst = $2; sub(/,.*/, "", dst); last = $NF }
    arch == "x86_64" {
      w = last ~ /zmm/ ? "zmm" : last ~ /ymm/ ? "ymm" : "xmm"
      if (m ~ /^vdpbf16ps/) k = "vdpbf16ps_" w
      else if (m ~ /^vfn?m(add|sub)[0-9]*ps$/) k = "fma_ps_" w
      else if (m ~ /^vfn?m(add|sub)[0-9]*pd$/) k = "fma_pd_" w
      else if (m == "mulps") k = "mulps_addps"
      else if (m == "mulpd") k = "mulpd_addpd"
      else next
      c[k]++
    }
    arch == "aarch64" {
      if (m == "bfmmla") k = dst ~ /^z/ ? "bfmmla_z" : "bfmmla_v"
      else if (m == "bfdot") k = dst ~ /^z/ ? "bfdot_z" : "bfdot_v"
      else if (m ~ /^(fmla|fmad)$/ && dst ~ /^z[0-9]+\.s/) k = "sve_fmla_s"
      else if (m ~ /^(fmla|fmad)$/ && dst ~ /^z[0-9]+\.d/) k = "sve_fmla_d"
      else if (m == "fmla" && dst ~ /\.4s$/) k = "fmla_4s"
      else if (m == "fmla" && dst ~ /\.2d$/) k = "fmla_2d"
      else next
      c[k]++
    }
    END { best = ""; for (k in c) if (best == "" || c[k] > c[best]) best = k; if (best != "") print best, c[best] }
  ' "$1"
}

peak_template() { # kind -> lines with {i}; 24 accumulators (12 without AVX-512)
  case $1 in
    fma_ps_zmm) echo 'vfmadd231ps %zmm30, %zmm31, %zmm{i}' ;;
    fma_pd_zmm) echo 'vfmadd231pd %zmm30, %zmm31, %zmm{i}' ;;
    fma_ps_ymm) echo 'vfmadd231ps %ymm14, %ymm15, %ymm{i}' ;;
    fma_pd_ymm) echo 'vfmadd231pd %ymm14, %ymm15, %ymm{i}' ;;
    fma_ps_xmm) echo 'vfmadd231ps %xmm14, %xmm15, %xmm{i}' ;;
    fma_pd_xmm) echo 'vfmadd231pd %xmm14, %xmm15, %xmm{i}' ;;
    vdpbf16ps_zmm) echo 'vdpbf16ps %zmm30, %zmm31, %zmm{i}' ;;
    vdpbf16ps_ymm) echo 'vdpbf16ps %ymm30, %ymm31, %ymm{i}' ;;
    mulps_addps) printf '%s\n' 'mulps %xmm15, %xmm{i}' 'addps %xmm15, %xmm{j}' ;;
    mulpd_addpd) printf '%s\n' 'mulpd %xmm15, %xmm{i}' 'addpd %xmm15, %xmm{j}' ;;
    fmla_4s) echo 'fmla v{i}.4s, v30.4s, v31.4s' ;;
    fmla_2d) echo 'fmla v{i}.2d, v30.2d, v31.2d' ;;
    sve_fmla_s) echo 'fmla z{i}.s, p0/m, z30.s, z31.s' ;;
    sve_fmla_d) echo 'fmla z{i}.d, p0/m, z30.d, z31.d' ;;
    bfmmla_v) echo 'bfmmla v{i}.4s, v30.8h, v31.8h' ;;
    bfmmla_z) echo 'bfmmla z{i}.s, z30.h, z31.h' ;;
    bfdot_v) echo 'bfdot v{i}.4s, v30.8h, v31.8h' ;;
    bfdot_z) echo 'bfdot z{i}.s, z30.h, z31.h' ;;
    *) return 1 ;;
  esac
}

triple() { case $1 in x86_64) echo x86_64-linux-gnu ;; aarch64) echo aarch64-linux-gnu ;; esac; }

# llvm-mca on a file: "cycles_per_iter rthroughput" or the error on stderr
# (llvm-mca skips an instruction it cannot parse, says error: and exits 0:
# any error: is a failure here).
run_mca() { # arch cpu file
  local o
  o=$("$MCA" -mtriple="$(triple "$1")" -mcpu="$2" -iterations="$ITER" "$3" 2>&1) &&
    ! printf '%s\n' "$o" | grep -q 'error:' || { printf '%s\n' "$o" >&2; return 1; }
  printf '%s\n' "$o" | awk '/^Iterations:/ {it = $2} /^Total Cycles:/ {tc = $3} /^Block RThroughput:/ {rt = $3}
    END { if (it > 0 && tc > 0 && rt > 0) printf "%.2f %.2f\n", tc / it, rt; else exit 1 }'
}

mkdir -p "$OUT/peak"
# The scheduling model llvm-mca takes for CPU (the prefix of its resources'
# names: LLVM 16 gives several CPUs another one's model, e.g. neoverse-n1 the
# Cortex-A57's A57Unit*), from the output of a run on FILE.
sched_model() { # arch cpu file
  local f=$OUT/peak/$2.model
  [ -f "$f" ] || "$MCA" -mtriple="$(triple "$1")" -mcpu="$2" -iterations=1 "$3" 2>/dev/null |
    awk '/^Resources:/ { r = 1; next } r && /^\[/ && (first == "") { first = $NF }
         r && /^\[/ && $NF ~ /(Unit|Port)|^Zn[0-9]/ { print $NF; exit } END { if (first != "") print first }' | head -1 |
    sed 's/^\(Zn[0-9]*\).*/\1/; s/\(Unit\|Port\).*//' > "$f"
  [ -s "$f" ] && cat "$f" || echo "?"
}
# The model's peak of KIND on CPU, instructions per cycle ("-" when the model
# has no such instruction: the CPU lacks it).
peak_of() { # arch cpu kind
  local f=$OUT/peak/$2-$3 nacc=24 r
  [ -f "$f.ipc" ] && { cat "$f.ipc"; return; }
  case $3 in *_ymm | *_xmm | mulp*) nacc=12 ;; esac
  case $3 in mulp*) nacc=7 ;; esac
  peak_template "$3" | awk -v n="$nacc" '{ t[NR] = $0 } END { for (i = 0; i < n; i++) for (l = 1; l <= NR; l++) {
      s = t[l]; gsub(/\{i\}/, i, s); gsub(/\{j\}/, i + n, s); print "\t" s } }' > "$f.s"
  if r=$(run_mca "$1" "$2" "$f.s" 2> "$f.err"); then
    echo "$r" | awk -v n="$nacc" '{ printf "%.3f\n", n / $2 }' > "$f.ipc"
    sched_model "$1" "$2" "$f.s" > /dev/null
  else
    echo - > "$f.ipc"
  fi
  cat "$f.ipc"
}

# ------------------------------------------------------------ the table
cpus_of() { case $1 in x86_64) echo "$X86_CPUS" ;; *) echo "$A64_CPUS" ;; esac; }
# Each region's kind, then the peaks (one llvm-mca run per CPU and kind).
kinds=$OUT/kinds.txt
while read -r arch tag src nm fn file ni back nbr; do
  kc=$(kind_of "$file" "$arch")
  [ -n "$kc" ] || die "$src ($arch, $tag): region $nm has no FMA-type instruction (vfmadd, fmla, bfmmla, vdpbf16ps ...)"
  set -- $kc
  peak_template "$1" > /dev/null || die "no peak loop for the kind $1 ($nm)"
  echo "$1 $2"
done < "$regions" > "$kinds"
paste -d' ' "$regions" "$kinds" | awk '{ print $1, $(NF - 1) }' | LC_ALL=C sort -u | while read -r arch kind; do
  for cpu in $(cpus_of "$arch"); do peak_of "$arch" "$cpu" "$kind" > /dev/null; done
done

fmt='%-22s %-7s %-5s %-14s %-7s %8s %6s %-19s %7s %5s %5s %s\n'
region_rows() { # arch tag src nm file kind nwork back nbr
  local arch=$1 tag=$2 src=$3 nm=$4 file=$5 kind=$6 nwork=$7 back=$8 nbr=$9 cpu pk r
  for cpu in $(cpus_of "$arch"); do
    # not one iteration of a loop: the compiler moved the marks (clang
    # schedules across them) or the region holds inner loops or branches
    if [ "$back" != yes ] || [ "$nbr" != 0 ]; then
      printf "$fmt" "$nm" "$arch" "$tag" "$cpu" - - - "$nwork ($kind)" - - - \
        "not one loop iteration: $([ "$back" != yes ] && echo "no back branch after END")$([ "$back" != yes ] && [ "$nbr" != 0 ] && echo ", ")$([ "$nbr" != 0 ] && echo "$nbr branches/labels inside")"
      continue
    fi
    pk=$(cat "$OUT/peak/$cpu-$kind.ipc")
    if [ "$pk" = - ]; then
      printf "$fmt" "$nm" "$arch" "$tag" "$cpu" - - - "$nwork ($kind)" - - - \
        "n/a: $(sed -n 's/^.*error: //p' "$OUT/peak/$cpu-$kind.err" | head -1 |
          sed 's/^found an unsupported instruction in the input.*/not in this model/')"
      continue
    fi
    r=$(run_mca "$arch" "$cpu" "$file" 2> "$file.$cpu.err") || {
      echo "llvm-mca rejected $nm ($src, $arch, $tag) on $cpu: $(grep -m1 -i error "$file.$cpu.err") (region in $file)"
      return 1; }
    set -- $r
    printf '%s %s %s %s\n' "$1" "$2" "$nwork" "$pk" | awk -v fmt="$fmt" -v nm="$nm" -v a="$arch" -v t="$tag" \
      -v c="$cpu" -v k="$kind" -v m="$(cat "$OUT/peak/$cpu.model")" '{
      ipc = $3 / $1; pct = 100 * ipc / $4
      printf fmt, nm, a, t, c, m, $1, $2, $3 " (" k ")", sprintf("%.2f", ipc), sprintf("%.2f", $4),
        sprintf("%.0f%%", pct), pct < 85 ? "<85%" : "" }'
  done
}
# The regions' rows, two llvm-mca at a time, then in order.
mkdir -p "$OUT/rows"
i=0
paste -d' ' "$regions" "$kinds" > "$OUT/work.txt"
while read -r arch tag src nm fn file ni back nbr kind nwork; do
  i=$((i + 1))
  f=$OUT/rows/$(printf '%04d' $i)
  ( region_rows "$arch" "$tag" "$src" "$nm" "$file" "$kind" "$nwork" "$back" "$nbr" > "$f.txt" || { cat "$f.txt" > "$f.fail"; } ) &
  [ $((i % 2)) = 0 ] && wait
done < "$OUT/work.txt"
wait
for f in "$OUT"/rows/*.fail; do [ -f "$f" ] && die "$(tail -1 "$f")"; done
table=$OUT/table.txt
{ printf "$fmt" kernel arch cc "CPU model" "(model)" cyc/iter RThru "FMA/iter (kind)" FMA/cyc peak %peak ""
  cat "$OUT"/rows/*.txt; } | sed 's/ *$//' > "$table"
cat "$table"
echo
echo "cyc/iter: llvm-mca's Total Cycles / $ITER iterations of the loop body; RThru: its Block RThroughput"
echo "(resource bound). peak: the model's FMA/cycle on a loop of independent instructions of the same"
echo "kind (its RThroughput); %peak = FMA/cyc / peak. Estimates of the inner loop's steady state only"
echo "(no cache misses, no packing, no edges); regions and logs in $OUT/."
printf '(model): the scheduling model llvm-mca takes for the CPU:'
for f in "$OUT"/peak/*.model; do [ -f "$f" ] && printf ' %s=%s' "$(basename "$f" .model)" "$(cat "$f")"; done
echo

# ------------------------------------------------------------ beside measurements
if [ -f "$MEASURED" ]; then
  echo
  echo "Estimate beside what make bench measured on a CPU we have ($MEASURED):"
  grep -v '^#' "$MEASURED" | while read -r nm cpu pct rest; do
    [ -n "$nm" ] || continue
    est=$(awk -v n="$nm" -v c="$cpu" '$1 == n && $3 == "gcc" && $4 == c { print $(NF - ($NF == "<85%" ? 1 : 0)) }' "$table" | head -1)
    printf '  %-24s %-15s llvm-mca %-5s measured %-5s %s\n' "$nm" "$cpu" "${est:--}" "$pct" "$rest"
  done
fi
