/* cpu_internal.h: what the CPU the process runs on offers, read once:
 * the vector instruction-set path (capped by NABLA_ISA) and the cache sizes
 * that kernels size their blocks from. Kernels ask here instead of carrying
 * constants tuned on one machine. */
#ifndef NABLA_CPU_INTERNAL_H
#define NABLA_CPU_INTERNAL_H

#include <stdint.h>

/* Instruction-set paths, each a superset of the one before: AVX2 means
 * AVX2+FMA; AVX512 means AVX-512F (with BW/VL/DQ where present);
 * AVX512BF16 adds vdpbf16ps; AMX adds AMX-BF16 tiles (with the OS's
 * permission, asked once). */
enum {
    NBI_ISA_PORTABLE = 0,
    NBI_ISA_AVX2 = 1,
    NBI_ISA_AVX512 = 2,
    NBI_ISA_AVX512BF16 = 3,
    NBI_ISA_AMX = 4,
    NBI_ISA_COUNT
};

typedef struct nbi_cpu {
    int detected;        /* the best path this CPU (and OS) supports */
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
 * avx512, avx512bf16, amx) or by nbi_isa_force. */
int nbi_isa(void);
/* Caps the path (tests and benchmarks): NBI_ISA_COUNT or -1 means no cap
 * beyond NABLA_ISA's. Returns the path in use after the call. */
int nbi_isa_force(int isa);
/* "portable", "avx2", "avx512", "avx512bf16", "amx". */
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

#endif
