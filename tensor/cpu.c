/* cpu.c: the CPU the process runs on, read once: the vector path (CPUID and
 * the OS's saved register state, capped by NABLA_ISA) and the data caches. */
#define _DEFAULT_SOURCE /* syscall */
#include "cpu_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

static nbi_cpu cpu;
static int env_cap = NBI_ISA_COUNT;         /* NABLA_ISA */
static _Atomic int forced = NBI_ISA_COUNT;  /* nbi_isa_force */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const isa_names[NBI_ISA_COUNT] = {"portable", "avx2", "avx512", "avx512bf16",
                                                     "amx"};

const char *nbi_isa_name(int isa) {
    return isa >= 0 && isa < NBI_ISA_COUNT ? isa_names[isa] : "unknown";
}

#if CPU_X86
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux hands out the AMX tile data state only to a process that asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA). */
static int amx_permitted(void) {
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

static int detect_isa(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return NBI_ISA_PORTABLE;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    if (!osxsave || !avx) return NBI_ISA_PORTABLE;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 6) != 6) return NBI_ISA_PORTABLE; /* the OS saves xmm and ymm */
    unsigned max = __get_cpuid_max(0, NULL);
    if (max < 7) return NBI_ISA_PORTABLE;
    unsigned b7, c7, d7, a71 = 0, tmp;
    __cpuid_count(7, 0, a, b7, c7, d7);
    __cpuid_count(7, 1, a71, tmp, tmp, tmp);
    int avx2 = (b7 >> 5) & 1, avx512f = (b7 >> 16) & 1;
    int avx512bf16 = (a71 >> 5) & 1;
    int amx_bf16 = (d7 >> 22) & 1, amx_tile = (d7 >> 24) & 1;
    if (!avx2 || !fma) return NBI_ISA_PORTABLE;
    if (!avx512f || (xcr0 & 0xe0) != 0xe0) return NBI_ISA_AVX2; /* opmask, zmm saved */
    if (!avx512bf16) return NBI_ISA_AVX512;
    if (!amx_bf16 || !amx_tile || (xcr0 & 0x60000) != 0x60000 || !amx_permitted())
        return NBI_ISA_AVX512BF16;
    return NBI_ISA_AMX;
}

static void read_name(void) {
    unsigned r[12];
    if (__get_cpuid_max(0x80000000, NULL) < 0x80000004) return;
    for (unsigned i = 0; i < 3; i++)
        __cpuid(0x80000002 + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
    char s[49];
    memcpy(s, r, 48);
    s[48] = 0;
    const char *p = s;
    while (*p == ' ') p++;
    strncpy(cpu.name, p, sizeof cpu.name - 1);
}
#endif

static int parse_isa(const char *s) {
    for (int i = 0; i < NBI_ISA_COUNT; i++)
        if (!strcasecmp(s, isa_names[i])) return i;
    return -1;
}

static void detect(void) {
    strcpy(cpu.name, "unknown");
    cpu.line = 64;
#if CPU_X86
    cpu.detected = detect_isa();
    read_name();
#else
    cpu.detected = NBI_ISA_PORTABLE;
#endif
    const char *e = getenv("NABLA_ISA");
    if (e && *e) {
        int v = parse_isa(e);
        env_cap = v >= 0 ? v : NBI_ISA_COUNT; /* an unknown name caps nothing */
    }
}

const nbi_cpu *nbi_cpu_info(void) {
    pthread_once(&once, detect);
    return &cpu;
}

int nbi_isa(void) {
    const nbi_cpu *c = nbi_cpu_info();
    int p = c->detected;
    if (env_cap < p) p = env_cap;
    int f = atomic_load_explicit(&forced, memory_order_relaxed);
    return f < p ? f : p;
}

int nbi_isa_force(int isa) {
    atomic_store(&forced, isa < 0 || isa >= NBI_ISA_COUNT ? NBI_ISA_COUNT : isa);
    return nbi_isa();
}
