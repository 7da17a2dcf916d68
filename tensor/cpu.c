/* cpu.c: the CPU the process runs on, read once: the vector path (CPUID and
 * the OS's saved register state, capped by NABLA_ISA) and the data caches. */
#define _DEFAULT_SOURCE /* syscall */
#include "cpu_internal.h"
#include "tensor_internal.h" /* nbi_env_warn */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#define CPU_X86 1
#else
#define CPU_X86 0
#endif
#if NBI_ARCH_ARM64 && defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#define CPU_ARM_LINUX 1
#else
#define CPU_ARM_LINUX 0
#endif

static nbi_cpu cpu;
static int env_cap = NBI_ISA_COUNT;         /* NABLA_ISA */
static _Atomic int forced = NBI_ISA_COUNT;  /* nbi_isa_force */
static pthread_once_t once = PTHREAD_ONCE_INIT;

#if NBI_ARCH_X86
static const char *const isa_names[NBI_ISA_COUNT] = {"portable", "avx2", "avx512", "avx512bf16",
                                                     "amx"};
#elif NBI_ARCH_ARM64
static const char *const isa_names[NBI_ISA_COUNT] = {"portable", "neon", "neon-bf16", "sve"};
#else
static const char *const isa_names[NBI_ISA_COUNT] = {"portable"};
#endif

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
    if ((unsigned)__get_cpuid_max(0x80000000, NULL) < 0x80000004u) return;
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

/* ---------------------------------------------------------------- aarch64 */
/* Linux's AT_HWCAP / AT_HWCAP2 bits (arch/arm64/include/uapi/asm/hwcap.h),
 * spelled out for libc headers that predate some of them. */
#define ARM_HWCAP_ASIMD (1ul << 1)
#define ARM_HWCAP_FPHP (1ul << 9)
#define ARM_HWCAP_ASIMDHP (1ul << 10)
#define ARM_HWCAP_CPUID (1ul << 11)
#define ARM_HWCAP_SVE (1ul << 22)
#define ARM_HWCAP2_SVE2 (1ul << 1)
#define ARM_HWCAP2_I8MM (1ul << 13)
#define ARM_HWCAP2_BF16 (1ul << 14)
#define ARM_HWCAP2_SME (1ul << 23)

unsigned nbi_cpu_arm_features(unsigned long hwcap, unsigned long hwcap2) {
    unsigned f = 0;
    if (hwcap & ARM_HWCAP_ASIMD) f |= NBI_CPU_ASIMD;
    /* both the scalar and the vector half-precision arithmetic */
    if ((hwcap & ARM_HWCAP_FPHP) && (hwcap & ARM_HWCAP_ASIMDHP)) f |= NBI_CPU_FPHP;
    if (hwcap & ARM_HWCAP_SVE) f |= NBI_CPU_SVE;
    if (hwcap2 & ARM_HWCAP2_SVE2) f |= NBI_CPU_SVE2;
    if (hwcap2 & ARM_HWCAP2_BF16) f |= NBI_CPU_BF16;
    if (hwcap2 & ARM_HWCAP2_I8MM) f |= NBI_CPU_I8MM;
    if (hwcap2 & ARM_HWCAP2_SME) f |= NBI_CPU_SME;
    return f;
}

int nbi_cpu_arm_path(unsigned features, int sve_bytes) {
    if (!(features & NBI_CPU_ASIMD)) return 0;                      /* portable */
    if ((features & NBI_CPU_SVE) && sve_bytes >= 16) return 3;      /* sve */
    return features & NBI_CPU_BF16 ? 2 /* neon-bf16 */ : 1 /* neon */;
}

/* MIDR implementer codes and part numbers (Arm's, and the parts of other
 * implementers one meets in servers and laptops). */
static const struct {
    unsigned impl, part;
    const char *name;
} arm_parts[] = {
    {0x41, 0xd03, "ARM Cortex-A53"},    {0x41, 0xd04, "ARM Cortex-A35"},
    {0x41, 0xd05, "ARM Cortex-A55"},    {0x41, 0xd07, "ARM Cortex-A57"},
    {0x41, 0xd08, "ARM Cortex-A72"},    {0x41, 0xd09, "ARM Cortex-A73"},
    {0x41, 0xd0a, "ARM Cortex-A75"},    {0x41, 0xd0b, "ARM Cortex-A76"},
    {0x41, 0xd0c, "ARM Neoverse-N1"},   {0x41, 0xd0d, "ARM Cortex-A77"},
    {0x41, 0xd40, "ARM Neoverse-V1"},   {0x41, 0xd41, "ARM Cortex-A78"},
    {0x41, 0xd44, "ARM Cortex-X1"},     {0x41, 0xd46, "ARM Cortex-A510"},
    {0x41, 0xd47, "ARM Cortex-A710"},   {0x41, 0xd48, "ARM Cortex-X2"},
    {0x41, 0xd49, "ARM Neoverse-N2"},   {0x41, 0xd4a, "ARM Neoverse-E1"},
    {0x41, 0xd4b, "ARM Cortex-A78C"},   {0x41, 0xd4d, "ARM Cortex-A715"},
    {0x41, 0xd4e, "ARM Cortex-X3"},     {0x41, 0xd4f, "ARM Neoverse-V2"},
    {0x41, 0xd80, "ARM Cortex-A520"},   {0x41, 0xd81, "ARM Cortex-A720"},
    {0x41, 0xd82, "ARM Cortex-X4"},     {0x41, 0xd84, "ARM Neoverse-V3"},
    {0x41, 0xd8e, "ARM Neoverse-N3"},   {0x46, 0x001, "Fujitsu A64FX"},
    {0x48, 0xd01, "HiSilicon Kunpeng-920"}, {0x61, 0x022, "Apple M1 Icestorm"},
    {0x61, 0x023, "Apple M1 Firestorm"}, {0x61, 0x032, "Apple M2 Blizzard"},
    {0x61, 0x033, "Apple M2 Avalanche"}, {0xc0, 0xac3, "Ampere-1"},
    {0xc0, 0xac4, "Ampere-1a"},
};

void nbi_cpu_arm_name(unsigned implementer, unsigned part, char *buf, size_t n) {
    for (size_t i = 0; i < sizeof arm_parts / sizeof *arm_parts; i++)
        if (arm_parts[i].impl == implementer && arm_parts[i].part == part) {
            snprintf(buf, n, "%s", arm_parts[i].name);
            return;
        }
    snprintf(buf, n, "aarch64 implementer 0x%02x part 0x%03x", implementer, part);
}

/* The value after "key" and a colon on a line of text, as a number (0x..). */
static bool cpuinfo_field(const char *text, const char *key, unsigned *v) {
    size_t kl = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        if (strncmp(l, key, kl)) continue;
        const char *p = l + kl;
        while (*p == ' ' || *p == '\t') p++;
        if (*p++ != ':') continue;
        char *end;
        unsigned long x = strtoul(p, &end, 0);
        if (end == p) return false;
        *v = (unsigned)x;
        return true;
    }
    return false;
}

int nbi_cpu_arm_cpuinfo(const char *text, unsigned *implementer, unsigned *part) {
    unsigned i, p;
    if (!text || !cpuinfo_field(text, "CPU implementer", &i) || !cpuinfo_field(text, "CPU part", &p))
        return -1;
    *implementer = i;
    *part = p;
    return 0;
}

#if CPU_ARM_LINUX
#ifndef PR_SVE_GET_VL
#define PR_SVE_GET_VL 51
#endif
#ifndef PR_SVE_VL_LEN_MASK
#define PR_SVE_VL_LEN_MASK 0xffff
#endif

/* The first CPU's MIDR from /proc/cpuinfo, or (where Linux emulates the ID
 * registers for user space, HWCAP_CPUID) from MIDR_EL1 of the CPU this
 * thread runs on; 0 when neither says. */
static int arm_midr(unsigned long hwcap, unsigned *impl, unsigned *part) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char text[8192];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        if (nbi_cpu_arm_cpuinfo(text, impl, part) == 0) return 1;
    }
    if (hwcap & ARM_HWCAP_CPUID) {
        uint64_t midr;
        __asm__ volatile("mrs %0, midr_el1" : "=r"(midr));
        *impl = (unsigned)(midr >> 24) & 0xff;
        *part = (unsigned)(midr >> 4) & 0xfff;
        return 1;
    }
    return 0;
}

static void detect_arm(void) {
    unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    cpu.features = nbi_cpu_arm_features(hwcap, hwcap2);
    if (cpu.features & NBI_CPU_SVE) {
        int vl = prctl(PR_SVE_GET_VL, 0, 0, 0, 0);
        cpu.sve_bytes = vl > 0 ? (vl & PR_SVE_VL_LEN_MASK) : 0;
    }
    cpu.detected = nbi_cpu_arm_path(cpu.features, cpu.sve_bytes);
    unsigned impl, part;
    if (arm_midr(hwcap, &impl, &part)) nbi_cpu_arm_name(impl, part, cpu.name, sizeof cpu.name);
}
#endif

/* ----------------------------------------------------------------- caches */
/* One cache as either source describes it; l1d, l2 and l3 of *c take the
 * data and unified ones (instruction caches and levels past 3 are left out). */
static void put_cache(nbi_cpu *c, int level, int data, int64_t size, int ways, int64_t line,
                      int sharing) {
    if (!data || size <= 0) return;
    int64_t *sz = level == 1 ? &c->l1d : level == 2 ? &c->l2 : level == 3 ? &c->l3 : NULL;
    if (!sz) return;
    int *w = level == 1 ? &c->l1d_ways : level == 2 ? &c->l2_ways : &c->l3_ways;
    int *sh = level == 1 ? &c->l1d_sharing : level == 2 ? &c->l2_sharing : &c->l3_sharing;
    *sz = size;
    *w = ways > 0 && ways <= 1024 ? ways : 0;
    *sh = sharing > 0 ? sharing : 0;
    if (level == 1 && line >= 16 && line <= 1024) c->line = line;
}

/* *c with its cache fields cleared (the line to the default 64). */
static nbi_cpu without_caches(const nbi_cpu *c) {
    nbi_cpu t = *c;
    t.l1d = t.l2 = t.l3 = 0;
    t.l1d_ways = t.l2_ways = t.l3_ways = 0;
    t.l1d_sharing = t.l2_sharing = t.l3_sharing = 0;
    t.line = 64;
    return t;
}

/* What put_cache wrote is believable: an L1d of 1 KiB to 16 MiB, and each
 * further level, where known, larger than the one before. Otherwise the
 * cache fields are cleared and -1 returned. */
static int plausible(nbi_cpu *c) {
    bool ok = c->l1d >= 1024 && c->l1d <= (16 << 20) && (c->l2 == 0 || c->l2 > c->l1d) &&
              (c->l3 == 0 || c->l3 > (c->l2 ? c->l2 : c->l1d));
    if (ok) return 0;
    *c = without_caches(c);
    return -1;
}

#if CPU_X86
static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > (1 << 20) ? 1 << 20 : (int)n;
}

/* Leaf 4 (Intel) and leaf 0x8000001D (AMD) have one layout: a subleaf per
 * cache until type 0; EAX type (1 data, 2 instruction, 3 unified), level, and
 * the logical CPUs sharing it - 1 (an upper bound: addressable IDs, capped
 * here by the CPUs online); EBX ways - 1, partitions - 1, line - 1; ECX
 * sets - 1. Returns how many data caches it found. */
static int read_cache_leaf(nbi_cpu *c, unsigned leaf) {
    int found = 0;
    for (unsigned i = 0; i < 16; i++) {
        unsigned a, b, cx, d;
        __cpuid_count(leaf, i, a, b, cx, d);
        int type = (int)(a & 31);
        if (type == 0) break;
        int level = (int)((a >> 5) & 7), sharing = (int)((a >> 14) & 0xfff) + 1;
        int ways = (int)(b >> 22) + 1, parts = (int)((b >> 12) & 0x3ff) + 1;
        int64_t line = (int64_t)(b & 0xfff) + 1, sets = (int64_t)cx + 1;
        int64_t size = (int64_t)ways * parts * line * sets;
        if (a & (1u << 9)) ways = 0; /* fully associative: no set conflicts to model */
        int online = online_cpus();
        bool data = type == 1 || type == 3;
        put_cache(c, level, data, size, ways, line, sharing < online ? sharing : online);
        found += data && level >= 1 && level <= 3;
    }
    return found;
}
#endif

int nbi_cpu_caches_cpuid(nbi_cpu *c) {
#if CPU_X86
    nbi_cpu t = without_caches(c);
    unsigned max = __get_cpuid_max(0, NULL), a, b, cx, d;
    int found = max >= 4 ? read_cache_leaf(&t, 4) : 0; /* zeros on AMD */
    if (!found && (unsigned)__get_cpuid_max(0x80000000, NULL) >= 0x8000001Du &&
        __get_cpuid(0x80000001, &a, &b, &cx, &d) && (cx >> 22) & 1 /* topology extensions */)
        found = read_cache_leaf(&t, 0x8000001D);
    if (!found || plausible(&t)) return -1;
    *c = t;
    return 0;
#else
    (void)c;
    return -1;
#endif
}

/* The first line of root/name into buf; false when it cannot be read. */
static bool read_line(const char *root, const char *name, char *buf, size_t n) {
    char path[512];
    if (snprintf(path, sizeof path, "%s/%s", root, name) >= (int)sizeof path) return false;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* "48K", "1024K", "32M", "4096": bytes, or -1. */
static int64_t parse_size(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 0) return -1;
    int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift) end++;
    if (*end || v > ((long long)1 << 40) >> shift) return -1;
    return (int64_t)v << shift;
}

/* The CPUs of a list like "0-3,8,10-11", or 0 when it is not one. */
static int count_cpus(const char *s) {
    int n = 0;
    while (*s) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s || lo < 0) return 0;
        s = end;
        if (*s == '-') {
            hi = strtol(s + 1, &end, 10);
            if (end == s + 1 || hi < lo) return 0;
            s = end;
        }
        n += (int)(hi - lo + 1);
        if (*s == ',') s++;
        else if (*s) return 0;
    }
    return n;
}

int nbi_cpu_caches_sysfs(nbi_cpu *c, const char *root) {
    nbi_cpu t = without_caches(c);
    int found = 0;
    for (int i = 0; i < 32 && root; i++) {
        char dir[384], buf[256];
        snprintf(dir, sizeof dir, "%s/index%d", root, i);
        if (!read_line(dir, "level", buf, sizeof buf)) continue;
        int level = atoi(buf);
        if (!read_line(dir, "type", buf, sizeof buf)) continue;
        bool data = !strcmp(buf, "Data") || !strcmp(buf, "Unified");
        if (!read_line(dir, "size", buf, sizeof buf)) continue;
        int64_t size = parse_size(buf);
        int ways = read_line(dir, "ways_of_associativity", buf, sizeof buf) ? atoi(buf) : 0;
        int64_t line = read_line(dir, "coherency_line_size", buf, sizeof buf) ? atoi(buf) : 0;
        int sharing = read_line(dir, "shared_cpu_list", buf, sizeof buf) ? count_cpus(buf) : 0;
        put_cache(&t, level, data, size, ways, line, sharing);
        found += data && size > 0 && level >= 1 && level <= 3;
    }
    if (!found || plausible(&t)) return -1;
    *c = t;
    return 0;
}

/* CPUID first; sysfs for what it does not say (all of it on a CPU without
 * the leaves, or in a VM that hides them; a missing level otherwise). */
static void detect_caches(void) {
    nbi_cpu s = cpu;
    int from_sysfs = nbi_cpu_caches_sysfs(&s, "/sys/devices/system/cpu/cpu0/cache") == 0;
    if (nbi_cpu_caches_cpuid(&cpu) == 0) {
        cpu.cache_source = "cpuid";
        if (from_sysfs && !cpu.l2 && s.l2 > cpu.l1d)
            cpu.l2 = s.l2, cpu.l2_ways = s.l2_ways, cpu.l2_sharing = s.l2_sharing;
        if (from_sysfs && !cpu.l3 && s.l3 > (cpu.l2 ? cpu.l2 : cpu.l1d))
            cpu.l3 = s.l3, cpu.l3_ways = s.l3_ways, cpu.l3_sharing = s.l3_sharing;
    } else if (from_sysfs) {
        cpu = s;
        cpu.cache_source = "sysfs";
    } else {
        cpu.cache_source = "none";
    }
}

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
#elif CPU_ARM_LINUX
    detect_arm();
#else
    cpu.detected = NBI_ISA_PORTABLE;
#endif
    detect_caches();
    const char *e = getenv("NABLA_ISA");
    if (e && *e) {
        int v = parse_isa(e);
        env_cap = v >= 0 ? v : NBI_ISA_COUNT; /* an unknown name caps nothing */
        if (v < 0) {
            char list[128] = "";
            for (int i = 0; i < NBI_ISA_COUNT; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         isa_names[i]);
            nbi_env_warn("NABLA_ISA=\"%s\" names no vector path (one of %s); it is ignored: "
                         "this CPU's best path, %s, runs", e, list, isa_names[cpu.detected]);
        }
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
