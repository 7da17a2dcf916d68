/* cpu_internal.h: what the CPU the process runs on offers, read once:
 * the vector instruction-set path (capped by NABLA_ISA) and the cache sizes
 * that kernels size their blocks from. Kernels ask here instead of carrying
 * constants tuned on one machine. */
#ifndef NABLA_CPU_INTERNAL_H
#define NABLA_CPU_INTERNAL_H

#include <stdint.h>

/* Instruction-set paths, one list per architecture, each path a superset of
 * the one before (NABLA_ISA and nbi_isa_force cap the path; a kernel asks
 * `nbi_isa() >= NBI_ISA_X`). Code naming a path of another architecture
 * does not compile: x86 kernels live under #if of their architecture.
 *
 * x86-64: AVX2 means AVX2+FMA; AVX512 means AVX-512F (with BW/VL/DQ where
 * present); AVX512BF16 adds vdpbf16ps; AMX adds AMX-BF16 tiles (with the
 * OS's permission, asked once).
 *
 * aarch64: NEON is Advanced SIMD (every aarch64 CPU); NEON_BF16 adds the
 * bf16 matrix and dot instructions (BFMMLA, BFDOT: FEAT_BF16); SVE adds the
 * scalable vectors for the f32/f64 kernels (its bf16 products are those of
 * NEON_BF16 when the CPU has FEAT_BF16, else the f32 fallback: an SVE CPU
 * without bf16, as A64FX, detects as SVE with NBI_CPU_BF16 unset).
 *
 * Other architectures (riscv64, s390x, ...): the portable path only. */
#if defined(__aarch64__)
#define NBI_ARCH_ARM64 1
enum { NBI_ISA_PORTABLE = 0, NBI_ISA_NEON = 1, NBI_ISA_NEON_BF16 = 2, NBI_ISA_SVE = 3, NBI_ISA_COUNT };
#elif defined(__x86_64__) || defined(__i386__)
#define NBI_ARCH_X86 1
enum {
    NBI_ISA_PORTABLE = 0,
    NBI_ISA_AVX2 = 1,
    NBI_ISA_AVX512 = 2,
    NBI_ISA_AVX512BF16 = 3,
    NBI_ISA_AMX = 4,
    NBI_ISA_COUNT
};
#else
enum { NBI_ISA_PORTABLE = 0, NBI_ISA_COUNT };
#endif
#ifndef NBI_ARCH_ARM64
#define NBI_ARCH_ARM64 0
#endif
#ifndef NBI_ARCH_X86
#define NBI_ARCH_X86 0
#endif

/* Features (nbi_cpu.features) beyond the path, as the OS reports them
 * (aarch64: getauxval AT_HWCAP / AT_HWCAP2). */
enum {
    NBI_CPU_ASIMD = 1 << 0, /* Advanced SIMD */
    NBI_CPU_FPHP = 1 << 1,  /* half-precision arithmetic, scalar and vector */
    NBI_CPU_SVE = 1 << 2,
    NBI_CPU_SVE2 = 1 << 3,
    NBI_CPU_BF16 = 1 << 4,  /* FEAT_BF16: BFMMLA, BFDOT, BFCVT */
    NBI_CPU_I8MM = 1 << 5,
    NBI_CPU_SME = 1 << 6,
};

typedef struct nbi_cpu {
    int detected;        /* the best path this CPU (and OS) supports */
    unsigned features;   /* NBI_CPU_* bits (0 on x86: the path says it all) */
    int sve_bytes;       /* SVE vector length in bytes (0 without SVE) */
    char name[64];       /* brand string, "unknown" when not known */
    /* Data caches, bytes (0 when not known; the kernels then assume
     * 32 KiB / 1 MiB / 8 MiB). l1d and l2 are per core; l3 is per
     * package (shared). ways: associativity, 0 when not known. */
    int64_t l1d, l2, l3;
    int l1d_ways, l2_ways, l3_ways;
    int64_t line;        /* cache line bytes (64 when not known) */
    /* Logical CPUs sharing each cache (0 when not known): more than one
     * on l1d/l2 means SMT siblings; on l3 the package's or CCX's CPUs. */
    int l1d_sharing, l2_sharing, l3_sharing;
    const char *cache_source; /* "cpuid", "sysfs" or "none" (all 0 above) */
} nbi_cpu;

/* The CPU as detected (read once, thread-safe). */
const nbi_cpu *nbi_cpu_info(void);
/* The path in use: the detected one, capped by NABLA_ISA (portable, avx2,
 * avx512, avx512bf16, amx; aarch64: portable, neon, neon-bf16, sve) or by
 * nbi_isa_force. */
int nbi_isa(void);
/* Caps the path (tests and benchmarks): NBI_ISA_COUNT or -1 means no cap
 * beyond NABLA_ISA's. Returns the path in use after the call. */
int nbi_isa_force(int isa);
/* x86: "portable", "avx2", "avx512", "avx512bf16", "amx";
 * aarch64: "portable", "neon", "neon-bf16", "sve". */
const char *nbi_isa_name(int isa);

/* The caches as CPUID tells them (Intel's leaf 4, AMD's 0x8000001D with the
 * topology extensions), or as the sysfs tree under `root` tells them
 * (normally "/sys/devices/system/cpu/cpu0/cache": in each indexN folder, the
 * files level, type, size, ways_of_associativity, coherency_line_size and
 * shared_cpu_list). Each fills
 * l1d, l2, l3, their ways, line and sharing of *c (leaving the other fields)
 * and returns 0, or returns -1 when it found no data cache (nothing written).
 * nbi_cpu_info reads CPUID first and sysfs when CPUID says nothing. */
int nbi_cpu_caches_cpuid(nbi_cpu *c);
int nbi_cpu_caches_sysfs(nbi_cpu *c, const char *root);

/* aarch64 detection, as pure functions (compiled on every architecture, for
 * the tests). nbi_cpu_arm_features: the NBI_CPU_* bits of Linux's AT_HWCAP
 * and AT_HWCAP2 words (FPHP: both FPHP and ASIMDHP). nbi_cpu_arm_path: the
 * aarch64 path they allow, as its number in the aarch64 list above (0
 * portable without ASIMD, 1 neon, 2 neon-bf16 with BF16, 3 sve with SVE and
 * a vector length of at least 16 bytes). nbi_cpu_arm_name: "ARM Neoverse-N1"
 * for MIDR implementer 0x41 part 0xd0c (a table of common parts), else
 * "aarch64 implementer 0x.. part 0x...". nbi_cpu_arm_cpuinfo: the first
 * "CPU implementer" and "CPU part" of /proc/cpuinfo's text; 0, or -1 when
 * either is missing. */
#include <stddef.h>
unsigned nbi_cpu_arm_features(unsigned long hwcap, unsigned long hwcap2);
int nbi_cpu_arm_path(unsigned features, int sve_bytes);
void nbi_cpu_arm_name(unsigned implementer, unsigned part, char *buf, size_t n);
int nbi_cpu_arm_cpuinfo(const char *text, unsigned *implementer, unsigned *part);

#endif
