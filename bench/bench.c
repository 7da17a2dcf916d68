/* bench.c: what nabla costs on this machine, in one run of `make bench`.
 *
 *   1. machine peak: independent chains of f32 FMAs (AVX-512 and AVX2+FMA,
 *      whichever the CPU has), on 1 thread and on every CPU; the best vector
 *      width is the peak that the matmul ratios use (f64 peak = f32 peak / 2)
 *   2. nb_matmul GFLOP/s (2MNK / time), square and attention shapes, with B
 *      contiguous and with B a transposed view; f64 at n = 512
 *   3. nb_attention (causal mask, dropout 0.1, training) forward and
 *      forward + backward of its sum; the allocator's peak for one fwd+bwd,
 *      with backward releasing saved tensors (the default) and retaining them
 *   4. nb_mha_forward (d_model 512, 8 heads, dropout 0.1) forward + backward
 *   5. autograd overhead: ns per op of a chain of 10,000 ops on (4,4) tensors
 *   6. the copy task's training step (examples/copy_task.c), two model sizes,
 *      and its allocator peak with and without retain_graph
 *   7. nb_save / nb_load of the d_model 512 model with Adam's state, nb_load
 *      of 120,000 and 1,000,000 empty tensors (the cost of names alone), the
 *      growth from 12,000 to 120,000 names of registering, nb_load and
 *      nb_params_get (the ratio of medians, beside the name index's work),
 *      and the cost of anomaly mode on the d_model 64 step
 *   8. GPT-2 124M training step (B=4 T=64 and B=1 T=1024, f32 and bf16
 *      autocast): ms/step, GFLOP/s, % of peak,
 *      the first step, peak RSS, on 1 thread and all CPUs (each a fresh
 *      process), and whether both give the same bits
 *   9. GPT-2 124M construction (nb_gpt_init) and generation (nb_gpt_generate
 *      with its KV cache, f32 and bf16 weights, prompts of 1 and 512 tokens,
 *      1 thread and all CPUs) beside the memory-bandwidth bound measured in
 *      the same run: weight bytes per token / streaming read bandwidth (and
 *      with the KV cache's bytes added), and PyTorch's tokens/s
 *  10. the GPT-2 tokenizer: encode (tokens/s, MB/s) and decode of 1 MiB
 *      of English and of one long word
 *  11. nb_batch_norm f32 training at the Fashion-MNIST network's shapes,
 *      forward and forward + backward, beside PyTorch's
 *  12. nb_conv2d: the Fashion-MNIST example's two layers (batch 64, f32,
 *      padding "same"), forward and backward (conv1's input needs no
 *      gradient, as in the network): ms, GFLOP/s, % of peak, PyTorch's ms
 *  13. examples/fashion_mnist.c's network: ms per training step of a batch
 *      of 64, GFLOP/s, the projected epoch (938 steps), with and without
 *      batch norm, beside PyTorch's (bench/torch_fashion.py)
 *  14. the process's peak RSS
 *
 * Each figure is the median of several timed runs (CLOCK_MONOTONIC) after
 * warm-up runs; "1t" runs with nb_set_num_threads(1), "Nt" with one thread
 * per online CPU. PyTorch figures come from bench/torch_results.txt (written
 * by bench/torch_bench.py, `key value` lines) when it exists; "-" otherwise.
 * Built with -DNB_BENCH_BLAS (make bench BLAS=1), the matmul table also has
 * OpenBLAS's sgemm/dgemm on the same operands.
 *
 * The machine may be shared: the load average is printed at both ends, and
 * other work skews the all-thread figures most. `bench 2 3` runs only
 * sections 2 and 3. Nothing here asserts a speed. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nabla.h"
#include "ops/conv_internal.h" /* whether a layer takes the Winograd kernels */
#include "nn/nn_internal.h"      /* nn_index_work_done: the name index's work */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86_PEAK 1
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#include <sys/auxv.h>
#define HAVE_ARM_PEAK 1
#endif

#ifdef NB_BENCH_BLAS
#include <cblas.h>
/* OpenBLAS extensions, declared here because the cblas.h found first may be
 * the reference one. */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
#endif

#ifndef NB_BENCH_DIR
#define NB_BENCH_DIR "bench"
#endif

static int ncpu = 1;
static double peak_1t = NAN, peak_nt = NAN; /* f32 GFLOP/s */

/* ------------------------------------------------------------------ utilities */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
    const char *msg = nb_last_error();
    fprintf(stderr, "bench: %s failed: %s\n", what, msg ? msg : "(no message)");
    exit(1);
}

static nb_tensor *need(nb_tensor *t, const char *what) {
    if (!t) die(what);
    return t;
}

static nb_tensor *leaf_randn(nb_dtype dt, int ndim, const int64_t *shape, bool grad,
                             nb_rng *rng) {
    nb_tensor *t = need(nb_randn(dt == NB_BF16 ? NB_F32 : dt, ndim, shape, rng), "nb_randn");
    if (dt == NB_BF16) { /* drawn in f32, rounded */
        nb_tensor *h = need(nb_to(t, NB_BF16), "nb_to");
        nb_free(t);
        t = h;
    }
    if (grad) need(nb_set_requires_grad(t, true), "nb_set_requires_grad");
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*work_fn)(void *ctx);

#define MAX_REPS 31

/* Median wall time of one call of fn, in seconds. */
static double median_time(work_fn fn, void *ctx, int warmup, int reps) {
    double t[MAX_REPS];
    if (reps > MAX_REPS) reps = MAX_REPS;
    for (int i = 0; i < warmup; i++) fn(ctx);
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        fn(ctx);
        t[i] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

static double ratio(double a, double b) {
    return isnan(a) || isnan(b) || b == 0 ? NAN : a / b;
}

/* A right-aligned number, or "-" for a missing one (NaN). */
static void cell(double v, int width, int prec) {
    if (isnan(v)) printf("%*s", width, "-");
    else printf("%*.*f", width, prec, v);
}

/* The thread counts measured: 1, then one per CPU. */
static int next_threads(int t) { return t < ncpu ? ncpu : ncpu + 1; }

static void section(const char *title) {
    printf("\n%s\n", title);
    fflush(stdout);
}

/* ------------------------------------------------------- PyTorch reference */

#define MAX_REFS 256
static struct {
    char key[80];
    double value;
} refs[MAX_REFS];
static int nrefs;
static char ref_header[256];

static void load_refs(void) {
    FILE *f = fopen(NB_BENCH_DIR "/torch_results.txt", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f) && nrefs < MAX_REFS) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#') {
            if (!ref_header[0]) snprintf(ref_header, sizeof ref_header, "%s", line + 1);
            continue;
        }
        if (sscanf(line, "%79s %lf", refs[nrefs].key, &refs[nrefs].value) == 2) nrefs++;
    }
    fclose(f);
}

/* The PyTorch figure for a printf-formatted key, NaN when there is none. */
static double ref(const char *fmt, ...) {
    char key[80];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    for (int i = 0; i < nrefs; i++)
        if (!strcmp(refs[i].key, key)) return refs[i].value;
    return NAN;
}

/* ------------------------------------------------------------------ header */

static void cpu_model(char *out, size_t n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], name[256] = "unknown";
    int family = -1, model = -1;
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (!strncmp(line, "model name", 10) && !strcmp(name, "unknown")) {
            snprintf(name, sizeof name, "%s", colon + 2);
            name[strcspn(name, "\n")] = 0;
        } else if (!strncmp(line, "cpu family", 10) && family < 0) {
            family = atoi(colon + 1);
        } else if (!strncmp(line, "model\t", 6) && model < 0) {
            model = atoi(colon + 1);
        }
    }
    if (f) fclose(f);
    snprintf(out, n, "%s (family %d, model %d)", name, family, model);
}

/* The first three fields of /proc/loadavg: other work on the machine skews
 * the figures, the all-thread ones most. */
static const char *loadavg(void) {
    static char buf[64];
    FILE *f = fopen("/proc/loadavg", "r");
    double a, b, c;
    if (f && fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
        snprintf(buf, sizeof buf, "%.2f %.2f %.2f (1, 5, 15 min)\n", a, b, c);
    else
        snprintf(buf, sizeof buf, "unknown\n");
    if (f) fclose(f);
    return buf;
}

static void print_header(void) {
    char date[64], cpu[320];
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", &tm);
    cpu_model(cpu, sizeof cpu);
    printf("nabla benchmark, %s\n", date);
    printf("cpu      %s, %d online CPU(s)\n", cpu, ncpu);
    printf("threads  1t = nb_set_num_threads(1), %dt = nb_set_num_threads(%d); default %d\n",
           ncpu, ncpu, nb_num_threads());
#if defined(__clang__)
    printf("compiler %s\n", __VERSION__);
#elif defined(__GNUC__)
    printf("compiler gcc %s\n", __VERSION__);
#endif
    if (nrefs)
        printf("pytorch  %s (%s)\n", ref_header[0] ? ref_header + 1 : "?",
               NB_BENCH_DIR "/torch_results.txt");
    else
        printf("pytorch  no %s: PyTorch columns show -\n", NB_BENCH_DIR "/torch_results.txt");
    printf("load     %s", loadavg());
    printf("method   median of several timed runs after warm-up; nb/pt = nabla / PyTorch "
           "(time: < 1 is faster; GFLOP/s: > 1 is faster)\n");
}

/* ------------------------------------------------------- 1. machine FMA peak */

typedef float (*fma_kernel)(long iters);

#ifdef HAVE_X86_PEAK
/* Read at run time, so that no compiler can fold the loops into constants. */
static volatile float fma_mul = 0.9999999f, fma_add = 1e-7f, fma_init = 1.0f;

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define REP16(X) REP12(X) X(12) X(13) X(14) X(15)

/* 16 independent zmm chains: more than latency x throughput of any current
 * core, so the FMA pipes never wait. m, c keep the values bounded. */
__attribute__((target("avx512f"))) static float fma_avx512(long iters) {
    __m512 m = _mm512_set1_ps(fma_mul), c = _mm512_set1_ps(fma_add), s = _mm512_setzero_ps();
    float init = fma_init;
#define DECL(i) __m512 a##i = _mm512_set1_ps(init + 0.01f * (float)(i));
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    REP16(DECL)
    for (long i = 0; i < iters; i++) {
        REP16(STEP)
    }
    REP16(SUM)
    float out[16];
    _mm512_storeu_ps(out, s);
    return out[0] + out[15];
}

/* 12 ymm chains: 16 registers hold them plus m and c. */
__attribute__((target("avx2,fma"))) static float fma_avx2(long iters) {
    __m256 m = _mm256_set1_ps(fma_mul), c = _mm256_set1_ps(fma_add), s = _mm256_setzero_ps();
    float init = fma_init;
#undef DECL
#undef STEP
#undef SUM
#define DECL(i) __m256 a##i = _mm256_set1_ps(init + 0.01f * (float)(i));
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm256_add_ps(s, a##i);
    REP12(DECL)
    for (long i = 0; i < iters; i++) {
        REP12(STEP)
    }
    REP12(SUM)
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

/* 16 zmm chains of vdpbf16ps: each is 16 lanes x 2 products x (mul + add) =
 * 64 bf16 FLOPs. The bf16 peak of the AVX512_BF16 path. */
__attribute__((target("avx512f,avx512bf16"))) static float dot_bf16(long iters) {
    __m512 s = _mm512_setzero_ps();
    __m512bh m = (__m512bh)_mm512_set1_epi16(0x3f80); /* bf16 1.0 */
    __m512bh c = (__m512bh)_mm512_set1_epi16(0x3380); /* tiny */
#undef DECL
#undef STEP
#undef SUM
#define DECL(i) __m512 a##i = _mm512_set1_ps(fma_init + 0.01f * (float)(i));
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, m, c);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    REP16(DECL)
    for (long i = 0; i < iters; i++) {
        REP16(STEP)
    }
    REP16(SUM)
    float out[16];
    _mm512_storeu_ps(out, s);
    return out[0] + out[15];
}
#endif

#ifdef HAVE_ARM_PEAK
/* aarch64: the same loops in Advanced SIMD (every aarch64 CPU), SVE (at the
 * CPU's vector length) and BFMMLA, each with more independent chains than
 * latency x pipes of any current core (4 x 4 on Neoverse V1/V2). */
static volatile float fma_mul = 0.9999999f, fma_add = 1e-7f, fma_init = 1.0f;

#define REP24(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) \
    X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)

/* 24 q-register chains of fmla: 24 x 4 lanes x 2 FLOPs per iteration. */
static float fma_neon(long iters) {
    float32x4_t m = vdupq_n_f32(fma_mul), c = vdupq_n_f32(fma_add), s = vdupq_n_f32(0);
    float init = fma_init;
#define DECL(i) float32x4_t a##i = vdupq_n_f32(init + 0.01f * (float)(i));
#define STEP(i) a##i = vfmaq_f32(c, a##i, m);
#define SUM(i) s = vaddq_f32(s, a##i);
    REP24(DECL)
    for (long i = 0; i < iters; i++) {
        REP24(STEP)
    }
    REP24(SUM)
    return vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 3);
#undef DECL
#undef STEP
#undef SUM
}

static volatile uint16_t mmla_one = 0x3f80, mmla_tiny = 0x3380;

/* 24 chains of bfmmla: each a 2x4 by 4x2 product into a 2x2 block, 16
 * multiply-adds = 32 bf16 FLOPs. */
__attribute__((target("arch=armv8.2-a+bf16"))) static float mmla_bf16(long iters) {
    float32x4_t s = vdupq_n_f32(0);
    /* bf16 1.0 and a tiny value, read at run time (as immediates gcc would
     * make an fp16 fmov of them, an instruction FEAT_BF16 does not imply) */
    bfloat16x8_t m = vreinterpretq_bf16_u16(vdupq_n_u16(mmla_one));
    bfloat16x8_t c = vreinterpretq_bf16_u16(vdupq_n_u16(mmla_tiny));
#define DECL(i) float32x4_t a##i = vdupq_n_f32(fma_init + 0.01f * (float)(i));
#define STEP(i) a##i = vbfmmlaq_f32(a##i, m, c);
#define SUM(i) s = vaddq_f32(s, a##i);
    REP24(DECL)
    for (long i = 0; i < iters; i++) {
        REP24(STEP)
    }
    REP24(SUM)
    return vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 3);
#undef DECL
#undef STEP
#undef SUM
}

#if defined(__ARM_FEATURE_SVE) || defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+sve")
#include <arm_sve.h>
/* 24 SVE chains at the CPU's vector length: 24 x svcntw() lanes x 2 FLOPs. */
static float fma_sve(long iters) {
    svbool_t p = svptrue_b32();
    svfloat32_t m = svdup_f32(fma_mul), c = svdup_f32(fma_add), s = svdup_f32(0);
    float init = fma_init;
#define DECL(i) svfloat32_t a##i = svdup_f32(init + 0.01f * (float)(i));
#define STEP(i) a##i = svmad_f32_x(p, a##i, m, c);
#define SUM(i) s = svadd_f32_x(p, s, a##i);
    REP24(DECL)
    for (long i = 0; i < iters; i++) {
        REP24(STEP)
    }
    REP24(SUM)
    return svaddv_f32(p, s);
#undef DECL
#undef STEP
#undef SUM
}
static double sve_lanes(void) {
    return (double)svcntw();
}
#pragma GCC pop_options
#define HAVE_SVE_PEAK 1
#endif
#endif

/* bf16 peak for the %pk of bf16 products: the vdpbf16ps loop's on a path
 * that uses it, else the f32 FMA peak (the fallback computes in f32). */
static double peak_bf16_1t = NAN, peak_bf16_nt = NAN;

typedef struct {
    fma_kernel kernel;
    long iters;
    int threads;
} peak_job;

typedef struct {
    const peak_job *job;
    float out; /* kept, so the loop is not dead code */
} peak_arg;

static volatile float peak_sink;

static void *peak_thread(void *p) {
    peak_arg *a = p;
    a->out = a->job->kernel(a->job->iters);
    return NULL;
}

/* All threads run the same loop; total flops over wall time from the first
 * pthread_create to the last join (creation is microseconds of ~40 ms). */
static void peak_run(void *p) {
    const peak_job *j = p;
    pthread_t th[64];
    peak_arg args[64];
    int n = j->threads < 64 ? j->threads : 64;
    for (int i = 0; i < n; i++) {
        args[i] = (peak_arg){j, 0};
        if (pthread_create(&th[i], NULL, peak_thread, &args[i]) != 0) {
            fprintf(stderr, "bench: pthread_create failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        peak_sink += args[i].out;
    }
}

static double peak_gflops(fma_kernel k, double flops_per_iter, int threads) {
    peak_job j = {k, 1L << 24, threads};
    double t = median_time(peak_run, &j, 1, 7);
    return flops_per_iter * (double)j.iters * threads / t * 1e-9;
}

static void bench_peak(void) {
    section("1. machine f32 FMA peak (GFLOP/s)");
    printf("%-36s %10s %10s\n", "loop", "1t", "Nt");
#ifdef HAVE_X86_PEAK
    struct {
        const char *name, *feature;
        fma_kernel k;
        double flops_per_iter;
    } kinds[2] = {{"AVX-512F, 16 zmm FMA chains", "avx512f", fma_avx512, 16 * 16 * 2},
                  {"AVX2+FMA, 12 ymm FMA chains", "avx2", fma_avx2, 12 * 8 * 2}};
    __builtin_cpu_init();
    for (int i = 0; i < 2; i++) {
        bool ok = i == 0 ? __builtin_cpu_supports("avx512f")
                         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        printf("%-36s", kinds[i].name);
        if (!ok) {
            printf(" %10s %10s  (not supported by this CPU)\n", "-", "-");
            continue;
        }
        double g1 = peak_gflops(kinds[i].k, kinds[i].flops_per_iter, 1);
        double gn = peak_gflops(kinds[i].k, kinds[i].flops_per_iter, ncpu);
        printf(" %10.1f %10.1f\n", g1, gn);
        if (isnan(peak_1t)) { /* the widest supported vector comes first */
            peak_1t = g1;
            peak_nt = gn;
            printf("  (the peak for %%pk ratios; f64 peak taken as half)\n");
        }
    }
    const char *isa = nb_cpu_isa(); /* amx: no AMX kernel yet, its products take vdpbf16ps */
    if (__builtin_cpu_supports("avx512f") && (!strcmp(isa, "avx512bf16") || !strcmp(isa, "amx"))) {
        double g1 = peak_gflops(dot_bf16, 16 * 16 * 4, 1), gn = peak_gflops(dot_bf16, 16 * 16 * 4, ncpu);
        printf("%-36s %10.1f %10.1f  (bf16 FLOPs: the bf16 peak)\n",
               "AVX512_BF16, 16 zmm vdpbf16ps chains", g1, gn);
        peak_bf16_1t = g1;
        peak_bf16_nt = gn;
    }
#elif defined(HAVE_ARM_PEAK)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    int has_sve = (hw >> 22) & 1, has_bf16 = (hw2 >> 14) & 1; /* HWCAP_SVE, HWCAP2_BF16 */
#ifdef HAVE_SVE_PEAK
    if (has_sve) {
        double fl = 24 * sve_lanes() * 2;
        double g1 = peak_gflops(fma_sve, fl, 1), gn = peak_gflops(fma_sve, fl, ncpu);
        char name[64];
        snprintf(name, sizeof name, "SVE (%d bits), 24 z FMA chains", (int)sve_lanes() * 32);
        printf("%-36s %10.1f %10.1f\n", name, g1, gn);
        peak_1t = g1;
        peak_nt = gn;
        printf("  (the peak for %%pk ratios; f64 peak taken as half)\n");
    }
#endif
    {
        double g1 = peak_gflops(fma_neon, 24 * 4 * 2, 1), gn = peak_gflops(fma_neon, 24 * 4 * 2, ncpu);
        printf("%-36s %10.1f %10.1f\n", "Advanced SIMD, 24 q FMA chains", g1, gn);
        if (isnan(peak_1t) || g1 > peak_1t) { /* where 128-bit SVE or NEON is faster */
            peak_1t = g1;
            peak_nt = gn;
            printf("  (the peak for %%pk ratios; f64 peak taken as half)\n");
        }
    }
    if (has_bf16) {
        double g1 = peak_gflops(mmla_bf16, 24 * 32, 1), gn = peak_gflops(mmla_bf16, 24 * 32, ncpu);
        printf("%-36s %10.1f %10.1f  (bf16 FLOPs: the bf16 peak)\n", "BFMMLA, 24 q chains", g1, gn);
        if (strcmp(nb_cpu_isa(), "neon") && strcmp(nb_cpu_isa(), "portable")) {
            peak_bf16_1t = g1;
            peak_bf16_nt = gn;
        }
    }
#else
    printf("%-36s %10s %10s  (no FMA loop for this target)\n", "-", "-", "-");
#endif
    if (isnan(peak_bf16_1t)) { /* the bf16 products' fallback computes in f32 */
        peak_bf16_1t = peak_1t;
        peak_bf16_nt = peak_nt;
    }
    printf("vector path of the kernels: %s (NABLA_ISA caps it)\n", nb_cpu_isa());
}

/* ------------------------------------------------------------- 2. matmul */

typedef struct {
    int64_t m, n, k;
} mnk;

typedef struct {
    nb_dtype dt;
    mnk s;
    bool trans;       /* B is nb_transpose of a contiguous (N,K) tensor */
    nb_tensor *a, *b; /* a (M,K); b (K,N), a view when trans */
    void *pa, *pb, *pc; /* the same operands for BLAS, and its output */
    int inner;        /* calls per timed sample, so that small shapes take ~ms */
} mm_ctx;

static void mm_nabla(void *p) {
    mm_ctx *c = p;
    for (int i = 0; i < c->inner; i++) {
        nb_scope_begin();
        need(nb_matmul(c->a, c->b), "nb_matmul");
        nb_scope_end();
    }
}

#ifdef NB_BENCH_BLAS
static void mm_blas(void *p) {
    mm_ctx *c = p;
    enum CBLAS_TRANSPOSE tb = c->trans ? CblasTrans : CblasNoTrans;
    int m = (int)c->s.m, n = (int)c->s.n, k = (int)c->s.k, ldb = c->trans ? k : n;
    for (int i = 0; i < c->inner; i++) {
        if (c->dt == NB_F32)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0f, c->pa, k, c->pb, ldb,
                        0.0f, c->pc, n);
        else
            cblas_dgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0, c->pa, k, c->pb, ldb,
                        0.0, c->pc, n);
    }
}
#endif

/* GFLOP/s of one product on `threads` threads, by nabla or by BLAS. */
static double mm_gflops(mm_ctx *c, int threads, bool blas) {
    double flops = 2.0 * (double)c->s.m * (double)c->s.n * (double)c->s.k;
    int reps = flops >= 5e9 ? 5 : flops >= 1e9 ? 7 : 11;
    work_fn fn = mm_nabla;
    c->inner = flops >= 2e8 ? 1 : (int)(2e8 / flops);
    nb_set_num_threads(threads);
#ifdef NB_BENCH_BLAS
    openblas_set_num_threads(threads);
    if (blas) fn = mm_blas;
#else
    (void)blas;
#endif
    return flops * c->inner / median_time(fn, c, 1, reps) * 1e-9;
}

typedef struct {
    mnk s;
    nb_dtype dt;
    bool trans;
    double nb[2], blas[2]; /* GFLOP/s; [0] 1 thread, [1] all */
} mm_row;

static void mm_measure(mm_row *r, bool blas) {
    if (blas && r->dt == NB_BF16) { /* no BLAS for bf16 */
        r->blas[0] = r->blas[1] = NAN;
        return;
    }
    nb_rng rng;
    nb_rng_seed(&rng, 42);
    mm_ctx c = {.dt = r->dt, .s = r->s, .trans = r->trans};
    int64_t rows = r->trans ? r->s.n : r->s.k, cols = r->trans ? r->s.k : r->s.n;
    c.a = leaf_randn(r->dt, NB_SHAPE(r->s.m, r->s.k), false, &rng);
    nb_tensor *base = leaf_randn(r->dt, NB_SHAPE(rows, cols), false, &rng);
    c.b = r->trans ? need(nb_transpose(base, 0, 1), "nb_transpose") : base;
    c.pa = nb_data(c.a);
    c.pb = nb_data(base);
    if (blas && !(c.pc = malloc((size_t)(r->s.m * r->s.n) * (r->dt == NB_F32 ? 4 : 8)))) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    double *out = blas ? r->blas : r->nb;
    out[0] = mm_gflops(&c, 1, blas);
    out[1] = mm_gflops(&c, ncpu, blas);
    free(c.pc);
    if (c.b != base) nb_free(c.b);
    nb_free(base);
    nb_free(c.a);
}

static void mm_print_row(const mm_row *r) {
    char shape[40];
    long long m = r->s.m, n = r->s.n, k = r->s.k;
    double pk = r->dt == NB_F32 ? 1.0 : 0.5; /* f64 peak = half the f32 one */
    double pk1 = r->dt == NB_BF16 ? peak_bf16_1t : pk * peak_1t;
    double pkn = r->dt == NB_BF16 ? peak_bf16_nt : pk * peak_nt;
    snprintf(shape, sizeof shape, "%s %lldx%lldx%lld", nb_dtype_name(r->dt), m, n, k);
    printf("%-20s %-4s", shape, r->trans ? "B^T" : "B");
    cell(r->nb[0], 8, 1);
    cell(100 * ratio(r->nb[0], pk1), 5, 0);
    cell(r->nb[1], 8, 1);
    cell(100 * ratio(r->nb[1], pkn), 5, 0);
    cell(ratio(r->nb[1], r->nb[0]), 7, 2);
    /* PyTorch: torch.matmul with B contiguous, or F.linear (B^T) */
    const char *kind = r->trans ? "linear" : "matmul", *dt = r->dt == NB_BF16 ? "_bf16" : "";
    double t1 = NAN, tn = NAN;
    if (r->dt != NB_F64) {
        t1 = ref("%s%s_gflops_1t_%lldx%lldx%lld", kind, dt, m, n, k);
        tn = ref("%s%s_gflops_%dt_%lldx%lldx%lld", kind, dt, ncpu, m, n, k);
    }
    cell(t1, 8, 1);
    cell(ratio(r->nb[0], t1), 7, 1);
    cell(tn, 8, 1);
    cell(ratio(r->nb[1], tn), 7, 1);
#ifdef NB_BENCH_BLAS
    cell(r->blas[0], 8, 1);
    cell(ratio(r->nb[0], r->blas[0]), 7, 2);
    cell(r->blas[1], 8, 1);
    cell(ratio(r->nb[1], r->blas[1]), 7, 2);
#endif
    printf("\n");
}

static void mm_print_table(const mm_row *rows, int n) {
    printf("%-20s %-4s%8s%5s%8s%5s%7s%8s%7s%8s%7s", "dtype MxNxK", "B", "1t", "%pk", "Nt",
           "%pk", "Nt/1t", "pt 1t", "nb/pt", "pt Nt", "nb/pt");
#ifdef NB_BENCH_BLAS
    printf("%8s%7s%8s%7s", "blas 1t", "nb/bl", "blas Nt", "nb/bl");
#endif
    printf("\n");
    for (int i = 0; i < n; i++) mm_print_row(&rows[i]);
#ifdef NB_BENCH_BLAS
    const char *env = getenv("OPENBLAS_CORETYPE");
    printf("blas: OpenBLAS cblas_sgemm/dgemm, core type %s (OPENBLAS_CORETYPE=%s)\n",
           openblas_get_corename(), env ? env : "unset");
#endif
}

static void bench_matmul(void) {
    static const mnk shapes[] = {{64, 64, 64},    {128, 128, 128},   {256, 256, 256},
                                 {512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048},
                                 {128, 128, 64},  {512, 512, 64},    {512, 64, 512}};
    /* GPT-2 124M's linear layers at B*T = 256 rows (c_attn, mlp_proj, lm_head),
     * B^T as nb_linear reads its weight */
    static const mnk gpt[] = {{256, 2304, 768}, {256, 768, 3072}, {256, 50257, 768}};
    enum { NSHAPES = sizeof shapes / sizeof shapes[0], NGPT = sizeof gpt / sizeof gpt[0] };
    mm_row rows[2 * NSHAPES + 2 + 2 * NGPT + 4];
    int n = 0;
    for (int i = 0; i < NSHAPES; i++)
        for (int t = 0; t < 2; t++) rows[n++] = (mm_row){.s = shapes[i], .dt = NB_F32, .trans = t};
    for (int t = 0; t < 2; t++) rows[n++] = (mm_row){.s = {512, 512, 512}, .dt = NB_F64, .trans = t};
    /* bf16 beside f32 (f32 accumulation; %pk of the bf16 peak of section 1) */
    for (int t = 0; t < 2; t++) rows[n++] = (mm_row){.s = {1024, 1024, 1024}, .dt = NB_BF16, .trans = t};
    for (int t = 0; t < 2; t++) rows[n++] = (mm_row){.s = {256, 256, 256}, .dt = NB_BF16, .trans = t};
    for (int i = 0; i < NGPT; i++)
        for (int d = 0; d < 2; d++)
            rows[n++] = (mm_row){.s = gpt[i], .dt = d ? NB_BF16 : NB_F32, .trans = true};

    section("2. nb_matmul GFLOP/s = 2MNK / time; B contiguous (K,N), B^T = nb_transpose of "
            "a contiguous (N,K); %pk of the FMA peak (bf16: of the bf16 peak); PyTorch's B^T "
            "rows are F.linear");
    for (int i = 0; i < n; i++) mm_measure(&rows[i], false);
#ifdef NB_BENCH_BLAS
    /* After all of nabla's runs: OpenBLAS's idle threads spin for a while
     * after each call and would take CPU from nabla's timings. */
    for (int i = 0; i < n; i++) mm_measure(&rows[i], true);
    openblas_set_num_threads(1);
    nanosleep(&(struct timespec){0, 300000000}, NULL);
#endif
    mm_print_table(rows, n);
}

/* Backward in the timed loops: as nb_backward, or retaining the graph (the
 * behaviour before backward released saved tensors), for the memory lines. */
static bool retain_graph;

static int backward(nb_tensor *loss) {
    nb_backward_opts o = {.retain_graph = retain_graph};
    return nb_backward_with_opts(loss, NULL, &o);
}

/* Allocator peak of one call of fn above what was allocated before, MiB. */
static double peak_mib(void (*fn)(void *), void *ctx) {
    int64_t before = nb_memory_allocated();
    nb_memory_reset_peak();
    fn(ctx);
    return (double)(nb_memory_peak() - before) / (1 << 20);
}

/* ------------------------------------------------------------- 3. attention */

typedef struct {
    nb_tensor *q, *k, *v, *mask;
    nb_rng rng;
    bool backward;
} attn_ctx;

static void attn_run(void *p) {
    attn_ctx *c = p;
    nb_scope_begin();
    nb_tensor *out = nb_attention(c->q, c->k, c->v, c->mask, 0.1, true, &c->rng, NULL);
    if (!out) die("nb_attention");
    if (c->backward && backward(nb_sum_all(out)) != 0) die("attention backward");
    nb_scope_end();
    /* as torch_bench.py's attn_fb sets .grad = None: each backward makes fresh
     * gradients instead of adding into the last ones */
    nb_clear_grad(c->q);
    nb_clear_grad(c->k);
    nb_clear_grad(c->v);
}

static attn_ctx attn_setup(const int64_t s[4]) {
    attn_ctx c = {0};
    nb_rng_seed(&c.rng, 7);
    c.q = leaf_randn(NB_F32, NB_SHAPE(s[0], s[1], s[2], s[3]), true, &c.rng);
    c.k = leaf_randn(NB_F32, NB_SHAPE(s[0], s[1], s[2], s[3]), true, &c.rng);
    c.v = leaf_randn(NB_F32, NB_SHAPE(s[0], s[1], s[2], s[3]), true, &c.rng);
    c.mask = need(nb_tril_mask(s[2], s[2]), "nb_tril_mask"); /* (L,L) broadcasts over B,H */
    return c;
}

static void attn_free(attn_ctx *c) {
    nb_free(c->q);
    nb_free(c->k);
    nb_free(c->v);
    nb_free(c->mask);
}

/* Storage bytes one fwd+bwd adds at its peak, from fresh leaves (their
 * gradients are part of it, as in PyTorch's figure). */
/* retain: keep the graph's saved tensors through backward */
static double attn_memory_mib(const int64_t s[4], bool retain) {
    nb_set_num_threads(1);
    attn_ctx c = attn_setup(s);
    c.backward = true;
    retain_graph = retain;
    double mib = peak_mib(attn_run, &c);
    retain_graph = false;
    attn_free(&c);
    return mib;
}

/* One row: forward and forward + backward at one shape and thread count. */
static void attn_row(attn_ctx *c, const char *name, int threads, int reps) {
    nb_set_num_threads(threads);
    c->backward = false;
    double fwd = 1e3 * median_time(attn_run, c, 1, reps);
    c->backward = true;
    double fb = 1e3 * median_time(attn_run, c, 1, reps);
    double pf = ref("attn_fwd_ms_%dt_%s", threads, name);
    double pb = ref("attn_fb_ms_%dt_%s", threads, name);
    printf("%-16s %4d", name, threads);
    cell(fwd, 10, 2);
    cell(pf, 10, 2);
    cell(ratio(fwd, pf), 8, 2);
    cell(fb, 10, 2);
    cell(pb, 10, 2);
    cell(ratio(fb, pb), 8, 2);
    printf("\n");
}

static void bench_attention(void) {
    static const int64_t shapes[4][4] = {{8, 8, 128, 64}, {4, 8, 512, 64}, {1, 8, 1024, 64},
                                         {2, 4, 64, 32}};
    section("3. nb_attention f32, causal (L,L) keep-mask, dropout 0.1, training (ms)");
    printf("%-16s %4s %9s %9s %7s %9s %9s %7s\n", "B x H x L x D", "thr", "fwd", "pt fwd",
           "nb/pt", "fwd+bwd", "pt f+b", "nb/pt");
    for (int i = 0; i < 4; i++) {
        const int64_t *s = shapes[i];
        char name[40];
        snprintf(name, sizeof name, "%lldx%lldx%lldx%lld", (long long)s[0], (long long)s[1],
                 (long long)s[2], (long long)s[3]);
        attn_ctx c = attn_setup(s);
        for (int t = 1; t <= ncpu; t = next_threads(t)) attn_row(&c, name, t, s[2] >= 512 ? 7 : 15);
        attn_free(&c);
    }
    double mib = attn_memory_mib(shapes[2], false), pt = ref("attn_mem_mib_1x8x1024x64");
    double kept = attn_memory_mib(shapes[2], true);
    printf("peak memory of one fwd+bwd at 1x8x1024x64, 1t: %.1f MiB (nb_memory_peak - "
           "allocated before); PyTorch ", mib);
    cell(pt, 0, 1);
    printf(" MiB (RSS high-water increment); nb/pt ");
    cell(ratio(mib, pt), 0, 2);
    printf("\n  with retain_graph (saved tensors kept through backward): %.1f MiB; released "
           "as backward goes (the default): %.1f MiB (%.0f%% less)\n", kept, mib,
           100 * (1 - mib / kept));
}

/* ------------------------------------------------------------------ 4. MHA */

typedef struct {
    nb_MHA m;
    nb_tensor *x;
    nb_rng rng;
} mha_ctx;

static void mha_run(void *p) {
    mha_ctx *c = p;
    nb_scope_begin();
    nb_tensor *y = nb_mha_forward(&c->m, c->x, c->x, c->x, NULL, true, &c->rng, NULL);
    if (!y || nb_backward(nb_sum_all(y)) != 0) die("nb_mha_forward + backward");
    nb_scope_end();
}

static void bench_mha(void) {
    static const int64_t shapes[2][2] = {{8, 128}, {4, 512}};
    section("4. nb_mha_forward self-attention, d_model 512, 8 heads, dropout 0.1, training, "
            "no mask: fwd+bwd (ms)");
    printf("%-16s %4s %9s %9s %7s\n", "B x L", "thr", "fwd+bwd", "pt f+b", "nb/pt");
    nb_params *ps = nb_params_new();
    if (!ps) die("nb_params_new");
    mha_ctx c;
    nb_rng_seed(&c.rng, 11);
    if (nb_mha_init(&c.m, ps, "mha", 512, 8, 0.1, true, &c.rng) != 0) die("nb_mha_init");
    for (int i = 0; i < 2; i++) {
        int64_t b = shapes[i][0], l = shapes[i][1];
        c.x = leaf_randn(NB_F32, NB_SHAPE(b, l, 512), true, &c.rng);
        for (int t = 1; t <= ncpu; t = next_threads(t)) {
            nb_set_num_threads(t);
            double ms = 1e3 * median_time(mha_run, &c, 1, l >= 512 ? 7 : 11);
            double pt = ref("mha_fb_ms_%dt_%lldx%lld", t, (long long)b, (long long)l);
            char name[32];
            snprintf(name, sizeof name, "%lldx%lld", (long long)b, (long long)l);
            printf("%-16s %4d", name, t);
            cell(ms, 10, 2);
            cell(pt, 10, 2);
            cell(ratio(ms, pt), 8, 2);
            printf("\n");
        }
        nb_free(c.x);
    }
    nb_params_free(ps);
}

/* ------------------------------------------------------ 5. autograd overhead */

#define CHAIN 10000

typedef struct {
    nb_tensor *x;
    int mode; /* 0 no grad, 1 recording, 2 forward + backward */
} chain_ctx;

/* y * 1.0001 as a custom function (nb_function): what the callback rule and
 * the context cost beside a built-in op */
static nb_tensor *scale_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)ctx, (void)n, (void)user;
    return nb_mul_scalar(in[0], 1.0001);
}
static int scale_backward(nb_function_ctx *ctx, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)ctx, (void)user;
    gin[0] = nb_mul_scalar(g, 1.0001);
    return 0;
}
static const nb_function scale_fn = {.name = "scale", .forward = scale_forward,
                                     .backward = scale_backward};

static void chain_run(void *p) {
    chain_ctx *c = p;
    if (c->mode == 0) nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *y = c->x;
    for (int i = 0; i < CHAIN; i++)
        y = i % 2 == 1       ? nb_add(y, c->x)
            : c->mode == 3 ? nb_function_apply(&scale_fn, &y, 1, NULL)
                           : nb_mul_scalar(y, 1.0001);
    if (!y) die("op chain");
    if (c->mode >= 2 && nb_backward(nb_sum_all(y)) != 0) die("op chain backward");
    nb_scope_end(); /* freeing the tensors and graph is part of the cost */
    nb_set_grad_enabled(true);
}

/* Second order and forward mode on a tanh MLP (B,64) -> 256 -> 256 -> 1, f32:
 * a gradient, a Hessian-vector product (create_graph, then a second
 * backward) and a jvp, each against the plain forward + backward. */
typedef struct {
    nb_tensor *x, *w[3], *v[3];
    int mode; /* 0 gradient, 1 Hessian-vector product, 2 jvp */
} mlp_ctx;

static nb_tensor *mlp_loss(nb_tensor **w, int n, void *ctx) {
    (void)n;
    nb_tensor *h = nb_tanh(nb_matmul(ctx, w[0]));
    h = nb_tanh(nb_matmul(h, w[1]));
    return nb_mean_all(nb_matmul(h, w[2]));
}

static void mlp_run(void *p) {
    mlp_ctx *c = p;
    nb_scope_begin();
    nb_tensor *g[3], *hv[3], *y, *ty;
    if (c->mode == 2) {
        if (nb_jvp(mlp_loss, c->x, 3, c->w, c->v, &y, &ty) != 0) die("jvp");
    } else {
        nb_tensor *loss = mlp_loss(c->w, 3, c->x);
        nb_backward_opts o = {.create_graph = c->mode == 1};
        if (nb_autograd_grad(&loss, 1, NULL, c->w, 3, &o, g) != 0) die("gradient");
        if (c->mode == 1) {
            nb_tensor *gv = nb_add(nb_add(nb_sum_all(nb_mul(g[0], c->v[0])),
                                          nb_sum_all(nb_mul(g[1], c->v[1]))),
                                   nb_sum_all(nb_mul(g[2], c->v[2])));
            if (nb_autograd_grad(&gv, 1, NULL, c->w, 3, NULL, hv) != 0) die("hvp");
        }
    }
    nb_scope_end();
}

static void bench_second_order(void) {
    static const char *names[3] = {"gradient", "Hessian-vector product", "jvp (forward mode)"};
    static const char *keys[3] = {"grad", "hvp", "jvp"};
    printf("\ntanh MLP (32,64)->256->256->1 f32, 1 thread\n%-26s %9s %9s %7s %9s\n", "", "ms",
           "pt ms", "nb/pt", "x grad");
    nb_rng rng;
    nb_rng_seed(&rng, 4);
    const int64_t shapes[3][2] = {{64, 256}, {256, 256}, {256, 1}};
    mlp_ctx c = {.x = leaf_randn(NB_F32, NB_SHAPE(32, 64), false, &rng)};
    for (int k = 0; k < 3; k++) {
        c.w[k] = leaf_randn(NB_F32, 2, shapes[k], true, &rng);
        c.v[k] = leaf_randn(NB_F32, 2, shapes[k], false, &rng);
    }
    double base = 0;
    for (int m = 0; m < 3; m++) {
        c.mode = m;
        double ms = 1e3 * median_time(mlp_run, &c, 2, 15);
        if (m == 0) base = ms;
        double pt = ref("mlp_%s_ms_1t", keys[m]);
        printf("%-26s", names[m]);
        cell(ms, 10, 3);
        cell(pt, 10, 3);
        cell(ratio(ms, pt), 8, 2);
        cell(ratio(ms, base), 10, 2);
        printf("\n");
    }
    nb_free(c.x);
    for (int k = 0; k < 3; k++) nb_free(c.w[k]), nb_free(c.v[k]);
}

static void bench_overhead(void) {
    static const char *names[4] = {"forward, grad mode off", "forward, recording",
                                   "forward + backward", "the same, custom mul_scalar"};
    static const char *keys[4] = {"nograd", "record", "fb", "fb_custom"};
    section("5. autograd overhead: chain of 10,000 ops (mul_scalar / add alternating) on (4,4) "
            "f32, requires grad, 1 thread");
    printf("%-26s %9s %9s %7s\n", "", "ns/op", "pt ns/op", "nb/pt");
    nb_set_num_threads(1);
    nb_rng rng;
    nb_rng_seed(&rng, 3);
    chain_ctx c = {leaf_randn(NB_F32, NB_SHAPE(4, 4), true, &rng), 0};
    for (int m = 0; m < 4; m++) { /* 3: every mul_scalar an nb_function (forward, backward) */
        c.mode = m;
        double ns = 1e9 * median_time(chain_run, &c, 2, 15) / CHAIN;
        double pt = ref("op_ns_%s_1t", keys[m]);
        printf("%-26s", names[m]);
        cell(ns, 10, 0);
        cell(pt, 10, 0);
        cell(ratio(ns, pt), 8, 2);
        printf("\n");
    }
    nb_free(c.x);
    bench_second_order();
}

/* -------------------------------------------------------------- 11. conv2d */

typedef struct {
    nb_tensor *x, *w, *b, *g, *y;
    bool grad_x;
} conv_ctx;

static nb_tensor *conv_same(conv_ctx *c) {
    return nb_conv2d(c->x, c->w, c->b, NULL, (const int64_t[]){NB_PADDING_SAME, 0}, NULL, 1);
}

static void conv_fwd_run(void *p) {
    conv_ctx *c = p;
    nb_set_grad_enabled(false);
    nb_free(need(conv_same(c), "nb_conv2d"));
    nb_set_grad_enabled(true);
}

/* forward with the graph, then backward of a fixed upstream gradient */
static void conv_fb_run(void *p) {
    conv_ctx *c = p;
    nb_tensor *y = need(conv_same(c), "nb_conv2d");
    if (nb_backward_with_grad(y, c->g)) die("nb_backward_with_grad");
    nb_free(y);
    nb_clear_grad(c->w);
    nb_clear_grad(c->b);
    if (c->grad_x) nb_clear_grad(c->x);
}

static void bench_conv(void) {
    section("12. nb_conv2d, the Fashion-MNIST network's layers (batch 64, f32, padding \"same\"): "
            "ms (median), GFLOP/s = 2 N O OH OW C KH KW / time (backward: x2 when x needs a "
            "gradient, else x1), %pk of the FMA peak (above 100 with Winograd's fewer "
            "multiply-adds); bwd = fwd+bwd - fwd");
    static const struct {
        const char *name;
        int64_t c, h, o, k;
        bool grad_x;
    } layers[2] = {{"conv1", 1, 28, 32, 5, false}, {"conv2", 32, 14, 64, 5, true}};
    if (isnan(peak_1t)) bench_peak();
    printf("%-14s %3s %9s %8s %6s %9s %7s\n", "", "thr", "ms", "GFLOP/s", "%pk", "pt ms",
           "nb/pt");
    nb_rng rng;
    nb_rng_seed(&rng, 11);
    for (int l = 0; l < 2; l++) {
        const int64_t N = 64, C = layers[l].c, H = layers[l].h, O = layers[l].o, K = layers[l].k;
        conv_ctx c = {leaf_randn(NB_F32, NB_SHAPE(N, C, H, H), layers[l].grad_x, &rng),
                      leaf_randn(NB_F32, NB_SHAPE(O, C, K, K), true, &rng),
                      leaf_randn(NB_F32, NB_SHAPE(O), true, &rng),
                      leaf_randn(NB_F32, NB_SHAPE(N, O, H, H), false, &rng), NULL,
                      layers[l].grad_x};
        double flops = 2.0 * (double)(N * O * H * H) * (double)(C * K * K);
        /* Winograd's F(2x2, KxK) (ops/arch/x86/conv_winograd.c): the multiply-adds it
         * executes, 2 (K+1)^2 C O per 2x2 tile each way (channels rounded up
         * to 16; the weight gradient's O up to 12) */
        nbi_wino_geom wg = {N, C, H, H, O, K, H, H, (K - 1) / 2, (K - 1) / 2};
        bool wino = nbi_wino_enabled() && nbi_wino_fits(&wg);
        double tiles = (double)N * (double)((H + 1) / 2) * (double)((H + 1) / 2);
        double cp = (double)((C + 15) / 16 * 16), op = (double)((O + 15) / 16 * 16);
        double oq = (double)(((O + 15) / 16 * 16 + 11) / 12 * 12), a2 = (double)((K + 1) * (K + 1));
        double wfl[2] = {2 * a2 * cp * op * tiles,
                         2 * a2 * cp * oq * tiles + (layers[l].grad_x ? 2 * a2 * cp * op * tiles : 0)};
        double run_pk[2] = {0, 0};
        for (int t = 1; t <= ncpu; t = next_threads(t)) {
            nb_set_num_threads(t);
            double fwd = median_time(conv_fwd_run, &c, 2, 11);
            double fb = median_time(conv_fb_run, &c, 2, 11);
            double bwd = fb - fwd, bflops = flops * (layers[l].grad_x ? 2 : 1);
            double pk = t == 1 ? peak_1t : peak_nt;
            const char *what[2] = {"forward", "backward"};
            double ms[2] = {1e3 * fwd, 1e3 * bwd}, fl[2] = {flops, bflops};
            for (int d = 0; d < 2; d++) {
                double gf = fl[d] / (ms[d] * 1e6), pt = ref("conv_%s_%s_ms_%dt", layers[l].name,
                                                            d ? "bwd" : "fwd", t);
                printf("%s %-8s %3d", layers[l].name, what[d], t);
                cell(ms[d], 10, 3);
                cell(gf, 9, 1);
                cell(100.0 * gf / pk, 7, 1);
                cell(pt, 10, 3);
                cell(ratio(ms[d], pt), 8, 2);
                printf("\n");
                if (t == 1) run_pk[d] = 100.0 * wfl[d] / (ms[d] * 1e6) / pk;
            }
        }
        if (wino)
            printf("  %s runs Winograd's F(2x2, %lldx%lld) (NABLA_WINOGRAD=0: im2col): the GFLOP/s "
                   "above count the direct conv's\n  multiply-adds; it executes %.0f%% of them "
                   "forward, %.0f%% backward, at %.1f%% and %.1f%% of the peak on 1 thread\n",
                   layers[l].name, (long long)K, (long long)K, 100 * wfl[0] / flops,
                   100 * wfl[1] / (flops * (layers[l].grad_x ? 2 : 1)), run_pk[0], run_pk[1]);
        nb_free(c.x);
        nb_free(c.w);
        nb_free(c.b);
        nb_free(c.g);
    }
    nb_set_num_threads(ncpu);
}

/* ----------------------------------------------------------- 6. copy task */

#define VOCAB 11
#define SEQ 10
#define PAD 0
#define START 1
#define BATCH 80

/* The data and masks of examples/copy_task.c: (n, SEQ) i64, START first,
 * then uniform over 1..VOCAB-1. */
static nb_tensor *random_sequences(int64_t n, nb_rng *rng) {
    nb_tensor *u = nb_rand(NB_F64, NB_SHAPE(n, SEQ), rng);
    nb_tensor *s = nb_empty(NB_I64, NB_SHAPE(n, SEQ));
    if (!u || !s) return NULL;
    const double *pu = nb_data(u);
    int64_t *ps = nb_data(s);
    for (int64_t i = 0; i < n * SEQ; i++)
        ps[i] = i % SEQ == 0 ? START : 1 + (int64_t)(pu[i] * (VOCAB - 1));
    return s;
}

static nb_tensor *padding_keep(nb_tensor *tokens) {
    if (!tokens) return NULL;
    nb_tensor *k = nb_ne(tokens, nb_full(NB_I64, 0, NULL, PAD));
    return nb_view(k, NB_SHAPE(nb_shape(tokens)[0], 1, 1, nb_shape(tokens)[1]));
}

static nb_tensor *causal_keep(nb_tensor *tokens) {
    if (!tokens) return NULL;
    int64_t len = nb_shape(tokens)[1];
    nb_tensor *no = nb_full(NB_BOOL, 0, NULL, 0);
    return nb_where(padding_keep(tokens), nb_tril_mask(len, len), no); /* (B,1,L,L) */
}

typedef struct {
    nb_Transformer model;
    nb_params *ps;
    nb_optim *opt;
    nb_rng data, drop;
    int64_t step;
} copy_ctx;

/* One step: forward, loss, backward, optimizer step, zero grad. */
static void copy_step(void *p) {
    copy_ctx *c = p;
    nb_optim_set_lr(c->opt, nb_noam_rate(c->step++, c->model.cfg.d_model, 1.0, 200));
    nb_scope_begin();
    nb_tensor *seq = need(random_sequences(BATCH, &c->data), "random_sequences");
    nb_tensor *tgt_in = nb_narrow(seq, 1, 0, SEQ - 1), *tgt_y = nb_narrow(seq, 1, 1, SEQ - 1);
    nb_tensor *src_keep = padding_keep(seq);
    nb_tensor *memory = nb_transformer_encode(&c->model, seq, src_keep, true, &c->drop);
    nb_tensor *out = nb_transformer_decode(&c->model, memory, src_keep, tgt_in,
                                           causal_keep(tgt_in), true, &c->drop);
    nb_tensor *logits = nb_reshape(nb_transformer_logits(&c->model, out), NB_SHAPE(-1, VOCAB));
    nb_tensor *loss = nb_cross_entropy(logits, nb_reshape(tgt_y, NB_SHAPE(-1)), PAD, 0.0);
    if (!loss || backward(loss) != 0) die("copy-task step");
    nb_optim_step(c->opt);
    nb_optim_zero_grad(c->opt);
    nb_scope_end();
}

static copy_ctx copy_setup(int64_t d_model, int64_t d_ff, int64_t heads);
static void copy_teardown(copy_ctx *c);

static void copy_bench_config(int64_t d_model, int64_t d_ff, int64_t heads, int reps) {
    copy_ctx c = copy_setup(d_model, d_ff, heads);
    char name[48];
    snprintf(name, sizeof name, "d%lld/ff%lld/h%lld, %.1fM", (long long)d_model, (long long)d_ff,
             (long long)heads, (double)nb_params_numel(c.ps) * 1e-6);
    for (int t = 1; t <= ncpu; t = next_threads(t)) {
        nb_set_num_threads(t);
        double ms = 1e3 * median_time(copy_step, &c, 2, reps);
        double pt = ref("copy_ms_%dt_d%lld", t, (long long)d_model);
        printf("%-24s %4d", name, t);
        cell(ms, 10, 1);
        cell(1e3 / ms, 9, 2);
        cell(400 * ms * 1e-3, 10, 1);
        cell(pt, 10, 1);
        cell(ratio(ms, pt), 8, 2);
        cell(400 * pt * 1e-3, 10, 1);
        printf("\n");
    }
    copy_teardown(&c);
}

static void bench_copy(void) {
    section("6. copy-task training step (batch 80 x length 10, vocab 11, 2 layers; forward, "
            "loss, backward, Adam step, zero grad)");
    printf("%-24s %4s %9s %9s %10s %9s %7s %10s\n", "config, parameters", "thr", "ms/step",
           "steps/s", "20x20 s", "pt ms", "nb/pt", "pt 20x20 s");
    copy_bench_config(64, 256, 4, 21);
    copy_bench_config(512, 2048, 8, 7);
    for (int i = 0; i < 2; i++) {
        int64_t d = i ? 512 : 64;
        copy_ctx c = copy_setup(d, 4 * d, i ? 8 : 4);
        nb_set_num_threads(1);
        copy_step(&c); /* Adam's state and the caches in place */
        retain_graph = true;
        double kept = peak_mib(copy_step, &c);
        retain_graph = false;
        double mib = peak_mib(copy_step, &c);
        printf("peak memory of one step at d_model %lld, 1t: %.2f MiB with retain_graph, "
               "%.2f MiB released as backward goes (%.0f%% less)\n", (long long)d, kept, mib,
               100 * (1 - mib / kept));
        copy_teardown(&c);
    }
}

/* ------------------------------------------- checkpoints and anomaly mode */
static copy_ctx copy_setup(int64_t d_model, int64_t d_ff, int64_t heads) {
    copy_ctx c = {.step = 0};
    nb_rng init;
    nb_rng_seed(&init, 1);
    nb_rng_seed(&c.data, 1001);
    nb_rng_seed(&c.drop, 2001);
    nb_TransformerConfig cfg = {.src_vocab = VOCAB, .tgt_vocab = VOCAB, .d_model = d_model,
                                .d_ff = d_ff, .heads = heads, .layers = 2, .max_len = 64,
                                .dropout = 0.1};
    c.ps = nb_params_new();
    if (!c.ps || nb_transformer_init(&c.model, c.ps, &cfg, &init) != 0) die("nb_transformer_init");
    c.opt = nb_adam(c.ps, 0.0, 0.9, 0.98, 1e-9, 0.0);
    if (!c.opt) die("nb_adam");
    return c;
}

static void copy_teardown(copy_ctx *c) {
    nb_optim_free(c->opt);
    nb_transformer_free(&c->model);
    nb_params_free(c->ps);
}

typedef struct {
    nb_params *all; /* the model and "optim." + Adam's state */
    char path[64];
} ckpt_ctx;

static void ckpt_save(void *p) {
    ckpt_ctx *c = p;
    if (nb_save(c->all, c->path) != 0) die("nb_save");
}

static void ckpt_load(void *p) {
    ckpt_ctx *c = p;
    if (nb_load(c->all, c->path) != 0) die("nb_load");
}

/* A checkpoint of n empty tensors (shape (0), one storage), "layers.<i>.w":
 * the cost of the names alone, which once grew as n^2 (a linear scan per
 * name when registering, parsing the header and matching it). */
static void bench_many_tensors(int n, const char *path) {
    /* the d512 model's buffers, cached, would add to this case's ~0.7 GB of
     * names and handles in the process's peak RSS (section 8) */
    nb_empty_cache();
    nb_params *ps = nb_params_new();
    if (!ps) die("nb_params_new");
    nb_scope_begin();
    nb_tensor *e = need(nb_zeros(NB_F32, NB_SHAPE(0)), "nb_zeros");
    char name[32];
    double t0 = now();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        if (!nb_params_add(ps, name, e)) die("nb_params_add");
    }
    double add = now() - t0;
    nb_scope_end();
    ckpt_ctx c = {.all = ps};
    snprintf(c.path, sizeof c.path, "%s", path);
    t0 = now();
    ckpt_save(&c);
    double save = now() - t0;
    struct stat st;
    double mb = stat(c.path, &st) == 0 ? (double)st.st_size / 1e6 : NAN;
    double load = median_time(ckpt_load, &c, 1, 3);
    printf("%9d empty tensors (%4.1f MB header): nb_load %6.0f ms (registering them %4.0f ms, "
           "nb_save %4.0f ms)\n", n, mb, 1e3 * load, 1e3 * add, 1e3 * save);
    unlink(c.path);
    nb_params_free(ps);
}

/* Registering n names, nb_load of their checkpoint and n nb_params_get, one
 * run each into t (seconds), and the name index's work (slots visited, on
 * this thread) into w. */
#define SCALE_RUNS 5
static void registry_phases(int n, const char *path, double t[3], double w[3]) {
    nb_params *ps = nb_params_new();
    if (!ps) die("nb_params_new");
    nb_scope_begin();
    nb_tensor *e = need(nb_zeros(NB_F32, NB_SHAPE(0)), "nb_zeros");
    char name[32];
    nn_index_work w0 = nn_index_work_done();
    double t0 = now();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        if (!nb_params_add(ps, name, e)) die("nb_params_add");
    }
    t[0] = now() - t0;
    nn_index_work w1 = nn_index_work_done();
    nb_scope_end();
    if (nb_save(ps, path) != 0) die("nb_save");
    nn_index_work w2 = nn_index_work_done();
    t0 = now();
    if (nb_load(ps, path) != 0) die("nb_load");
    t[1] = now() - t0;
    nn_index_work w3 = nn_index_work_done();
    t0 = now();
    for (int i = n - 1; i >= 0; i--) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        if (!nb_params_get(ps, name)) die("nb_params_get");
    }
    t[2] = now() - t0;
    nn_index_work w4 = nn_index_work_done();
    w[0] = (double)(w1.probes - w0.probes + w1.moved - w0.moved) / n;
    w[1] = (double)(w3.probes - w2.probes + w3.moved - w2.moved) / n;
    w[2] = (double)(w4.probes - w3.probes + w4.moved - w3.moved) / n;
    unlink(path);
    nb_params_free(ps);
}

/* The growth from 12,000 to 120,000 names: time (median of SCALE_RUNS runs,
 * interleaved) beside the work the index did, which make test's checkpoint
 * suite bounds (the time is not asserted anywhere: on a shared machine the
 * cache, not the algorithm, moves it most). */
static void bench_registry_scaling(const char *path) {
    static const int sizes[2] = {12000, 120000};
    static const char *const phase[3] = {"registering", "nb_load", "nb_params_get"};
    double t[2][3][SCALE_RUNS], w[2][3], ms[2][3];
    for (int r = 0; r < SCALE_RUNS; r++)
        for (int s = 0; s < 2; s++) {
            double one[3];
            registry_phases(sizes[s], path, one, w[s]);
            for (int p = 0; p < 3; p++) t[s][p][r] = one[p];
        }
    printf("registry scaling, 12,000 -> 120,000 names (\"layers.<i>.w\", empty tensors; "
           "median of %d runs; linear growth is 10x):\n", SCALE_RUNS);
    for (int p = 0; p < 3; p++) {
        for (int s = 0; s < 2; s++) {
            qsort(t[s][p], SCALE_RUNS, sizeof(double), cmp_double);
            ms[s][p] = 1e3 * t[s][p][SCALE_RUNS / 2];
        }
        printf("  %-14s %7.1f -> %7.1f ms (%5.1fx); index slots visited a name %.2f -> %.2f\n",
               phase[p], ms[0][p], ms[1][p], ratio(ms[1][p], ms[0][p]), w[0][p], w[1][p]);
    }
}

static void bench_checkpoint(void) {
    section("7. checkpoints (model + Adam state, safetensors, file in /tmp) and anomaly mode");
    copy_ctx m = copy_setup(512, 2048, 8);
    copy_step(&m); /* Adam's state is in place */
    ckpt_ctx c = {.all = nb_params_new()};
    snprintf(c.path, sizeof c.path, "/tmp/nabla-bench-%ld.safetensors", (long)getpid());
    if (!c.all || nb_params_add_all(c.all, "", m.ps) != 0 ||
        nb_params_add_all(c.all, "optim.", nb_optim_state(m.opt)) != 0)
        die("nb_params_add_all");
    ckpt_save(&c);
    struct stat st;
    double mb = stat(c.path, &st) == 0 ? (double)st.st_size / 1e6 : NAN;
    double save = median_time(ckpt_save, &c, 1, 5), load = median_time(ckpt_load, &c, 1, 5);
    printf("d512/ff2048/h8 model + Adam: %.1f MB file; nb_save %.0f ms (%.0f MB/s, written, "
           "fsynced, renamed), nb_load %.0f ms (%.0f MB/s, read and checked whole)\n", mb,
           1e3 * save, mb / save, 1e3 * load, mb / load);
    unlink(c.path);
    nb_params_free(c.all);
    copy_teardown(&m);
    bench_many_tensors(120000, c.path);
    bench_many_tensors(1000000, c.path);
    bench_registry_scaling(c.path);

    printf("%-34s %4s %12s %12s %7s\n", "copy-task step, d64/ff256/h4", "thr", "ms, off",
           "ms, anomaly", "ratio");
    for (int t = 1; t <= ncpu; t = next_threads(t)) {
        nb_set_num_threads(t);
        copy_ctx a = copy_setup(64, 256, 4);
        double off = 1e3 * median_time(copy_step, &a, 2, 21);
        nb_set_detect_anomaly(true);
        double on = 1e3 * median_time(copy_step, &a, 2, 21);
        nb_set_detect_anomaly(false);
        printf("%-34s %4d", "nb_set_detect_anomaly(true)", t);
        cell(off, 12, 1);
        cell(on, 12, 1);
        cell(on / off, 7, 2);
        printf("\n");
        copy_teardown(&a);
    }
}

/* --------------------------------------------------- 8. GPT-2 124M training step */
/* One training step of GPT-2 124M (NB_GPT2_CONFIG: tied, GELU tanh) on a
 * batch of B=4 rows of T=64 tokens, llm.c's defaults, and of B=1 row of
 * T=1024 (GPT-2's context): nb_gpt_loss, backward, AdamW (lr 1e-4, no weight
 * decay), nb_optim_clear_grad; in f32, and in bf16 (the forward inside
 * nb_autocast_begin(NB_BF16), as --dtype bf16 does). Each run is a process
 * of its own (this program run again with --gpt2-child), so that its peak RSS
 * is the model's alone. FLOPs per step: 6 x 124M parameters x B*T tokens (the
 * usual estimate, as llm.c and the issue count them; attention's own
 * products, 12% more at T=1024, are not counted), so GFLOP/s and % of the
 * FMA peak of section 1 (bf16: of the bf16 peak). */
#define GPT_STEPS 6

typedef struct {
    double first_ms, median_ms, rss_mib, alloc_peak_mib;
    uint64_t hash; /* of every loss and every parameter after the last step */
} gpt_result;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211u;
    return h;
}

static double vm_hwm_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = NAN;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024;
}

/* The child: measures, prints one line "gpt2 first median rss alloc hash";
 * steps steps (GPT_STEPS when 0), each block under nb_checkpoint when
 * checkpoint is set. */
static int gpt2_child(int threads, int64_t B, int64_t T, bool bf16, bool checkpoint, int steps) {
    if (steps < 2 || steps > GPT_STEPS) steps = GPT_STEPS;
    nb_set_num_threads(threads);
    nb_GPTConfig cfg = NB_GPT2_CONFIG;
    nb_params *ps = nb_params_new();
    nb_GPT m;
    nb_rng init = {1, 0}, data = {2, 0};
    if (!ps || nb_gpt_init(&m, ps, &cfg, &init) != 0) die("nb_gpt_init");
    m.checkpoint = checkpoint;
    nb_optim *opt = nb_adamw(ps, 1e-4, 0.9, 0.999, 1e-8, 0.0);
    if (!opt) die("nb_adamw");
    nb_tensor *tok = need(nb_to(nb_mul_scalar(nb_rand(NB_F64, NB_SHAPE(B, T + 1), &data),
                                              (double)cfg.vocab_size - 1e-9), NB_I64), "tokens");
    double t[GPT_STEPS];
    uint64_t h = 1469598103934665603u;
    for (int s = 0; s < steps; s++) {
        double t0 = now();
        nb_scope_begin();
        nb_tensor *x = nb_narrow(tok, 1, 0, T), *y = nb_narrow(tok, 1, 1, T);
        if (bf16) nb_autocast_begin(NB_BF16);
        nb_tensor *loss = nb_gpt_loss(&m, x, y, true, NULL);
        if (bf16) nb_autocast_end();
        if (!loss || nb_backward(loss) != 0) die("GPT-2 step");
        nb_optim_step(opt);
        nb_optim_clear_grad(opt);
        float l = (float)nb_item(loss);
        h = fnv(h, &l, sizeof l);
        nb_scope_end();
        t[s] = now() - t0;
    }
    for (int i = 0; i < nb_params_count(ps); i++) {
        nb_tensor *p = nb_params_at(ps, i, NULL);
        h = fnv(h, nb_data(p), (size_t)nb_numel(p) * sizeof(float));
    }
    double first = t[0];
    qsort(t + 1, (size_t)steps - 1, sizeof t[0], cmp_double);
    double median = steps % 2 ? (t[steps / 2] + t[steps / 2 + 1]) / 2 : t[steps / 2];
    printf("gpt2 %.3f %.3f %.1f %.1f %016llx\n", 1e3 * first, 1e3 * median, vm_hwm_mib(),
           (double)nb_memory_peak() / (1 << 20), (unsigned long long)h);
    nb_optim_free(opt);
    nb_gpt_free(&m);
    nb_params_free(ps);
    return 0;
}

static bool gpt2_run(const char *self, int threads, int64_t B, int64_t T, bool bf16,
                     bool checkpoint, int steps, gpt_result *r) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' --gpt2-child %d %lld %lld %d %d %d", self, threads,
             (long long)B, (long long)T, (int)bf16, (int)checkpoint, steps);
    FILE *p = popen(cmd, "r");
    char line[256];
    bool ok = false;
    unsigned long long hash = 0;
    while (p && fgets(line, sizeof line, p))
        if (sscanf(line, "gpt2 %lf %lf %lf %lf %llx", &r->first_ms, &r->median_ms, &r->rss_mib,
                   &r->alloc_peak_mib, &hash) == 5)
            ok = true;
    r->hash = hash;
    if (p && pclose(p) != 0) ok = false;
    return ok;
}

static char self_path[4096];

/* One configuration on 1 thread and on all CPUs; the f32 median ms of the
 * B=4 T=64 1-thread run goes to *f32_ms (for the bf16 speed-up). */
static void gpt2_config(int64_t B, int64_t T, bool bf16, double *base_ms) {
    const double flops = 6.0 * 124439808.0 * (double)(B * T);
    /* PyTorch's keys: gpt2[_bf16][_b1t1024]_{ms,first_ms,rss_mib}_{T}t */
    char key[40];
    snprintf(key, sizeof key, "gpt2%s%s", bf16 ? "_bf16" : "", T == 1024 ? "_b1t1024" : "");
    gpt_result r[2];
    int n = 0;
    for (int t = 1; t <= ncpu && n < 2; t = next_threads(t), n++) {
        if (!gpt2_run(self_path, t, B, T, bf16, false, 0, &r[n])) {
            printf("%-4s B=%lld T=%-5lld %-3d (the child process failed)\n", bf16 ? "bf16" : "f32",
                   (long long)B, (long long)T, t);
            return;
        }
        double pk = bf16 ? (t == 1 ? peak_bf16_1t : peak_bf16_nt) : t == 1 ? peak_1t : peak_nt;
        double gf = flops / (r[n].median_ms * 1e-3) / 1e9;
        double pt = ref("%s_ms_%dt", key, t);
        printf("%-4s B=%lld T=%-5lld %-3d", bf16 ? "bf16" : "f32", (long long)B, (long long)T, t);
        cell(r[n].median_ms, 9, 0);
        cell(gf, 8, 1);
        cell(100 * gf / pk, 7, 1);
        cell(r[n].first_ms, 10, 0);
        cell(r[n].first_ms / r[n].median_ms, 8, 2);
        cell(r[n].rss_mib, 9, 0);
        cell(pt, 9, 0);
        cell(ratio(r[n].median_ms, pt), 8, 2);
        cell(ref("%s_first_ms_%dt", key, t), 9, 0);
        cell(ref("%s_rss_mib_%dt", key, t), 9, 0);
        printf("\n");
    }
    if (n == 2)
        printf("    %dt/1t %.2fx; after %d steps losses and weights bitwise the same on 1 and %d "
               "threads: %s; allocator peak %.0f MiB", ncpu, r[0].median_ms / r[1].median_ms,
               GPT_STEPS, ncpu, r[0].hash == r[1].hash ? "yes" : "NO", r[0].alloc_peak_mib);
    if (n == 2 && bf16 && base_ms[0] > 0)
        printf("; bf16 / f32 speed-up 1t %.2fx, %dt %.2fx", base_ms[0] / r[0].median_ms, ncpu,
               base_ms[1] / r[1].median_ms);
    if (n == 2 && !bf16) base_ms[0] = r[0].median_ms, base_ms[1] = r[1].median_ms;
    printf("\n");
}

/* Activation checkpointing (nb_GPT.checkpoint: each block under
 * nb_checkpoint) at B=4 T=1024 on all CPUs, beside the same step without
 * it: peak RSS and step time, and PyTorch's with and without
 * torch.utils.checkpoint per block. 3 steps each (the median of the last
 * two): a step takes some seconds. */
static void pair_row(const char *name, double ms, double rss, double ms0, double rss0) {
    printf("  %-32s", name);
    cell(ms, 9, 0);
    cell(rss, 9, 0);
    cell(ratio(ms, ms0), 9, 2);
    cell(ratio(rss, rss0), 9, 2);
    printf("\n");
}

static void gpt2_checkpoint_pair(void) {
    const int steps = 3, t = ncpu;
    gpt_result r[2];
    for (int ck = 0; ck < 2; ck++)
        if (!gpt2_run(self_path, t, 4, 1024, false, ck, steps, &r[ck])) {
            printf("activation checkpointing: the child process failed\n");
            return;
        }
    printf("activation checkpointing, f32 B=4 T=1024, %d threads, %d steps (median of the last "
           "%d):\n", t, steps, steps - 1);
    printf("  %-32s %9s %9s %9s %9s\n", "", "ms/step", "RSS MiB", "time x", "memory x");
    pair_row("nabla", r[0].median_ms, r[0].rss_mib, r[0].median_ms, r[0].rss_mib);
    pair_row("nabla, nb_GPT.checkpoint", r[1].median_ms, r[1].rss_mib, r[0].median_ms,
             r[0].rss_mib);
    const char *pt_key[2] = {"gpt2_b4t1024", "gpt2_b4t1024_ckpt"};
    double pt_ms[2], pt_rss[2];
    for (int ck = 0; ck < 2; ck++) {
        pt_ms[ck] = ref("%s_ms_%dt", pt_key[ck], t);
        pt_rss[ck] = ref("%s_rss_mib_%dt", pt_key[ck], t);
    }
    pair_row("PyTorch", pt_ms[0], pt_rss[0], pt_ms[0], pt_rss[0]);
    pair_row("PyTorch, torch.utils.checkpoint", pt_ms[1], pt_rss[1], pt_ms[0], pt_rss[0]);
    printf("  losses and weights after %d steps bitwise the same with and without: %s; nabla / "
           "PyTorch with checkpointing: time %.2fx, memory %.2fx\n", steps,
           r[0].hash == r[1].hash ? "yes" : "NO",
           ratio(r[1].median_ms, pt_ms[1]), ratio(r[1].rss_mib, pt_rss[1]));
}

static void bench_gpt2(void) {
    section("8. GPT-2 124M training step (tied; nb_gpt_loss, backward, AdamW, "
            "nb_optim_clear_grad; each run a fresh process; bf16 = autocast, f32 master weights)");
    printf("%-4s %-13s %-3s %9s %8s %7s %10s %8s %9s %9s %8s %9s %9s\n", "", "shape", "thr",
           "ms/step", "GFLOP/s", "% peak", "first ms", "first/st", "RSS MiB", "pt ms", "nb/pt",
           "pt first", "pt RSS");
    double base[2][2] = {{0, 0}, {0, 0}};
    gpt2_config(4, 64, false, base[0]);
    gpt2_config(4, 64, true, base[0]);
    gpt2_config(1, 1024, false, base[1]);
    gpt2_config(1, 1024, true, base[1]);
    gpt2_checkpoint_pair();
    printf("PyTorch (pt): nanoGPT's model, f32 or torch.autocast(\"cpu\", torch.bfloat16) around "
           "forward and loss; llm.c's train_gpt2.c (f32, B=4 T=64) measured here: 2.46 GiB RSS\n");
}

/* ------------------------------------------------------------ generation */
/* Streaming read bandwidth: a buffer 16x a 32 MiB LLC (more than any current
 * x86 LLC per core group), summed by `threads` threads; the median of 7 reads
 * after one that faults the pages in. Integer sums (never latency-bound),
 * compiled for the widest vectors the CPU has (target_clones: chosen at run
 * time; SSE2 loads measured 10-25% below AVX-512's here). */
enum { BW_MIB = 512 };
typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_part;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void *bw_read(void *arg) {
    bw_part *b = arg;
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= b->n; i += 8)
        for (int q = 0; q < 8; q++) s[q] += b->p[i + q];
    b->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

typedef struct {
    const uint64_t *buf;
    size_t n;
    int threads;
} bw_ctx;

static volatile uint64_t bw_sink;

static void bw_run(void *p) {
    bw_ctx *c = p;
    pthread_t th[64];
    bw_part part[64];
    size_t per = c->n / (size_t)c->threads / 8 * 8;
    for (int t = 0; t < c->threads; t++) {
        part[t] = (bw_part){c->buf + (size_t)t * per, per, 0};
        if (t > 0) pthread_create(&th[t], NULL, bw_read, &part[t]);
    }
    bw_read(&part[0]);
    for (int t = 1; t < c->threads; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < c->threads; t++) bw_sink ^= part[t].sum;
}

/* GB/s (1e9 bytes), or NaN when the buffer cannot be had */
static double read_bandwidth(int threads) {
    size_t bytes = (size_t)BW_MIB << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf) return NAN;
    memset(buf, 1, bytes);
    bw_ctx c = {buf, bytes / sizeof *buf, threads};
    double t = median_time(bw_run, &c, 1, 7);
    free(buf);
    return (double)bytes / t / 1e9;
}

/* Times between generated tokens (on_token), after the first: the first
 * token's time includes the prompt's forward. */
enum { GEN_TOKENS = 33 };
typedef struct {
    double last, dt[GEN_TOKENS];
    int n;
} gen_clock;

static bool gen_tick(int64_t tok, void *user) {
    (void)tok;
    gen_clock *g = user;
    double t = now();
    if (g->n > 0) g->dt[g->n - 1] = t - g->last;
    g->last = t;
    g->n++;
    return true;
}

/* tokens/s: 1 / the median time per generated token (GEN_TOKENS - 1 of them) */
static double gen_rate(nb_GPT *m, int64_t plen, nb_dtype dt) {
    int64_t *prompt = malloc((size_t)plen * sizeof *prompt);
    if (!prompt) die("prompt");
    for (int64_t i = 0; i < plen; i++) prompt[i] = (i * 7919 + 13) % m->cfg.vocab_size;
    nb_gpt_sample_opts o = {.greedy = true, .dtype = dt};
    gen_clock g = {0};
    if (nb_gpt_generate(m, prompt, plen, GEN_TOKENS, &o, NULL, NULL, gen_tick, &g) != GEN_TOKENS)
        die("nb_gpt_generate");
    free(prompt);
    qsort(g.dt, GEN_TOKENS - 1, sizeof g.dt[0], cmp_double);
    return 1.0 / g.dt[(GEN_TOKENS - 1) / 2];
}

typedef struct {
    nb_GPT m;
    nb_params *ps;
} gpt_model;

static void gpt_make(void *p) {
    gpt_model *g = p;
    if (g->ps) {
        nb_gpt_free(&g->m);
        nb_params_free(g->ps);
    }
    nb_GPTConfig cfg = NB_GPT2_CONFIG;
    nb_rng rng = {1, 0};
    if (!(g->ps = nb_params_new()) || nb_gpt_init(&g->m, g->ps, &cfg, &rng)) die("nb_gpt_init");
}

static void bench_generate(void) {
    section("9. GPT-2 124M generation: nb_gpt_generate with the KV cache, greedy, random weights "
            "(nb_gpt_init); tokens/s = 1 / median time per token over 32 generated tokens after "
            "the prompt's (the first token's time, prompt included, is left out); bound = "
            "streaming read bandwidth / weight bytes read per token");
    double bw[2] = {NAN, NAN}, init[2] = {NAN, NAN};
    int thr[2] = {1, ncpu};
    int nthr = ncpu > 1 ? 2 : 1;
    gpt_model g = {0};
    for (int i = 0; i < nthr; i++) {
        nb_set_num_threads(thr[i]);
        bw[i] = read_bandwidth(thr[i]);
        init[i] = median_time(gpt_make, &g, 0, 3);
    }
    printf("streaming read of %d MiB (median of 7): 1t %.1f GB/s", BW_MIB, bw[0]);
    if (nthr == 2) printf(", %dt %.1f GB/s", ncpu, bw[1]);
    printf("\nconstruction nb_gpt_init(NB_GPT2_CONFIG) (median of 3): 1t %.2f s", init[0]);
    if (nthr == 2) printf(", %dt %.2f s", ncpu, init[1]);
    /* bytes read per token: every parameter but wpe (one row of it is read); a
     * tied lm_head is wte, counted once. bf16: the linear weights (lm_head
     * included) in 2 bytes, the rest (biases, layer norms) in 4. */
    double all = 0, lin = 0;
    for (int i = 0; i < nb_params_count(g.ps); i++) {
        const char *name;
        nb_tensor *p = nb_params_at(g.ps, i, &name);
        if (strstr(name, "wpe")) continue;
        all += (double)nb_numel(p);
        if (strstr(name, "wte") || (strstr(name, ".weight") && nb_ndim(p) == 2)) lin += (double)nb_numel(p);
    }
    double bytes[2] = {4 * all, 2 * lin + 4 * (all - lin)};
    printf("\nweight bytes per token: f32 %.1f MB, bf16 %.1f MB (1 MB = 1e6 bytes)\n",
           bytes[0] / 1e6, bytes[1] / 1e6);
    /* the KV cache read per token besides (f32 keys and values of every
     * layer up to the token's position; the median token's is about
     * prompt + 16): "% w+kv" is of the bound with those bytes added */
    const double kv_per_pos = 2.0 * (double)g.m.cfg.n_layer * (double)g.m.cfg.n_embd * 4;
    printf("KV cache read per token at position L: %.1f kB x L (f32, both dtypes)\n",
           kv_per_pos / 1e3);
    printf("%-5s %7s %4s %9s %9s %8s %7s %9s %6s\n", "dtype", "prompt", "thr", "tokens/s", "bound",
           "% bound", "% w+kv", "pt tok/s", "nb/pt");
    for (int d = 0; d < 2; d++)
        for (int pl = 0; pl < 2; pl++)
            for (int i = 0; i < nthr; i++) {
                int64_t plen = pl ? 512 : 1;
                nb_set_num_threads(thr[i]);
                double r = gen_rate(&g.m, plen, d ? NB_BF16 : NB_F32);
                double bound = bw[i] * 1e9 / bytes[d];
                /* PyTorch's keys: gen[_bf16]_tok_s_{T}t_p{prompt} */
                double pt = ref("gen%s_tok_s_%dt_p%lld", d ? "_bf16" : "", thr[i], (long long)plen);
                double kv = kv_per_pos * (double)(plen + GEN_TOKENS / 2);
                printf("%-5s %7lld %4d %9.1f %9.1f %8.0f %7.0f", d ? "bf16" : "f32",
                       (long long)plen, thr[i], r, bound, 100 * r / bound,
                       100 * r * (bytes[d] + kv) / (bw[i] * 1e9));
                cell(pt, 10, 1);
                cell(ratio(r, pt), 7, 2);
                printf("\n");
            }
    printf("PyTorch (pt): bench/torch_bench.py's GPT-2 with a hand-written KV cache, greedy, "
           "median per-token time over 32 tokens; bf16 = the model in bfloat16; nb/pt > 1: "
           "nabla faster\n");
    nb_set_num_threads(ncpu);
    nb_gpt_free(&g.m);
    nb_params_free(g.ps);
}

/* ------------------------------------------------------ 10. GPT-2 tokenizer */
typedef struct {
    const nb_tokenizer *tok;
    const char *text;
    int64_t len, *ids, n;
} tok_ctx;

static void tok_encode(void *p) {
    tok_ctx *c = p;
    c->n = nb_tokenizer_encode(c->tok, c->text, c->len, c->ids, c->len);
    if (c->n < 0) die("nb_tokenizer_encode");
}

static void tok_decode(void *p) {
    tok_ctx *c = p;
    if (nb_tokenizer_decode(c->tok, c->ids, c->n, (char *)c->text, c->len) != c->len)
        die("nb_tokenizer_decode");
}

static void tok_row(const char *label, tok_ctx *c) {
    double te = median_time(tok_encode, c, 1, 5), td = median_time(tok_decode, c, 1, 5);
    printf("%-34s %9.2f %10.0f %10.1f %10.1f\n", label, te * 1e3, (double)c->n / te,
           (double)c->len / te / 1e6, (double)c->len / td / 1e6);
}

/* encode and decode of 1 MB (one thread: a call never splits its work) */
static void bench_tokenizer(void) {
    section("10. GPT-2 tokenizer (nb_tokenizer, tests/fixtures/gpt2/encoder.json), 1 MiB, 1 thread");
    double t0 = now();
    nb_tokenizer *tok = nb_tokenizer_load(NB_BENCH_DIR "/../tests/fixtures/gpt2/encoder.json");
    if (!tok) die("nb_tokenizer_load");
    printf("load encoder.json + vocab.bpe: %.1f ms\n", (now() - t0) * 1e3);
    int64_t n = 1 << 20;
    char *text = malloc((size_t)n), *kjv = NULL;
    int64_t *ids = malloc((size_t)n * sizeof *ids), kn = 0;
    if (!text || !ids) die("malloc");
    FILE *f = fopen(NB_BENCH_DIR "/../examples/data/kjv.txt", "rb");
    if (f && (kjv = malloc((size_t)n))) kn = (int64_t)fread(kjv, 1, (size_t)n, f);
    if (f) fclose(f);
    printf("%-34s %9s %10s %10s %10s\n", "text", "enc ms", "tokens/s", "enc MB/s", "dec MB/s");
    tok_ctx c = {tok, text, n, ids, 0};
    for (int64_t i = 0; kn > 0 && i < n; i++) text[i] = kjv[i % kn];
    if (kn > 0) tok_row("English (examples/data/kjv.txt)", &c);
    uint64_t s = 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        text[i] = (char)('a' + (s >> 33) % 26);
    }
    tok_row("one word of random letters", &c);
    memset(text, 'a', (size_t)n);
    tok_row("one word \"aaa...\"", &c);
    free(text), free(kjv), free(ids);
    nb_tokenizer_free(tok);
}

/* ------------------------------------------------ Fashion-MNIST network */
/* examples/fashion_mnist.c's network (conv 5x5x32 same, ReLU, pool 2; conv
 * 5x5x64 same, ReLU, pool 2; dense 1024, ReLU, dropout 0.4; dense 10;
 * cross-entropy; Adam), one training step of a batch of 64 random images. */
#define FASHION_BATCH 64
#define FASHION_STEPS_PER_EPOCH 938 /* 60,000 / 64, rounded up */

typedef struct {
    nb_params *ps;
    nb_Conv2d conv1, conv2;
    nb_BatchNorm bn1, bn2;
    bool bn;
    nb_Linear fc1, fc2;
    nb_optim *opt;
    nb_tensor *x, *y; /* (64, 1, 28, 28) U(0, 1), (64) labels; persistent */
    nb_rng drop;
    bool bf16; /* the forward under nb_autocast_begin(NB_BF16) */
} fashion_ctx;

static nb_tensor *fashion_block(const nb_Conv2d *c, nb_BatchNorm *bn, nb_tensor *x) {
    const int64_t two[2] = {2, 2};
    nb_tensor *h = nb_conv2d_forward(c, x);
    if (bn) h = nb_batchnorm_forward(bn, h);
    return nb_max_pool2d(nb_relu(h), two, NULL, NULL);
}

static void fashion_step(void *p) {
    fashion_ctx *c = p;
    nb_scope_begin();
    if (c->bf16) nb_autocast_begin(NB_BF16);
    nb_tensor *h = fashion_block(&c->conv1, c->bn ? &c->bn1 : NULL, c->x);
    h = fashion_block(&c->conv2, c->bn ? &c->bn2 : NULL, h);
    h = nb_relu(nb_linear_forward(&c->fc1, nb_reshape(h, NB_SHAPE(FASHION_BATCH, 64 * 7 * 7))));
    h = nb_linear_forward(&c->fc2, nb_dropout(h, 0.4, true, &c->drop));
    nb_tensor *loss = nb_cross_entropy(h, c->y, -1, 0.0);
    if (c->bf16) nb_autocast_end();
    if (nb_backward(need(loss, "fashion forward")) != 0)
        die("fashion backward");
    nb_optim_step(c->opt);
    nb_optim_zero_grad(c->opt);
    nb_scope_end();
}

static fashion_ctx fashion_setup(bool bn) {
    fashion_ctx c = {.bn = bn};
    const int64_t k5[2] = {5, 5}, same[2] = {NB_PADDING_SAME, NB_PADDING_SAME};
    nb_rng init, data;
    nb_rng_seed(&init, 1);
    nb_rng_seed(&data, 2);
    nb_rng_seed(&c.drop, 3);
    c.ps = nb_params_new();
    if (!c.ps || nb_conv2d_init(&c.conv1, c.ps, "conv1", 1, 32, k5, NULL, same, NULL, 1, true, &init) ||
        nb_conv2d_init(&c.conv2, c.ps, "conv2", 32, 64, k5, NULL, same, NULL, 1, true, &init) ||
        (bn && (nb_batchnorm2d_init(&c.bn1, c.ps, "bn1", 32, 1e-5, 0.1) ||
                nb_batchnorm2d_init(&c.bn2, c.ps, "bn2", 64, 1e-5, 0.1))) ||
        nb_linear_init(&c.fc1, c.ps, "fc1", 64 * 7 * 7, 1024, true, &init) ||
        nb_linear_init(&c.fc2, c.ps, "fc2", 1024, 10, true, &init))
        die("the fashion network's init");
    c.opt = nb_adam(c.ps, 1e-3, 0.9, 0.999, 1e-8, 0.0);
    if (!c.opt) die("nb_adam");
    c.x = need(nb_rand(NB_F32, NB_SHAPE(FASHION_BATCH, 1, 28, 28), &data), "nb_rand");
    nb_scope_begin();
    nb_tensor *u = need(nb_rand(NB_F64, NB_SHAPE(FASHION_BATCH), &data), "nb_rand");
    c.y = need(nb_empty(NB_I64, NB_SHAPE(FASHION_BATCH)), "nb_empty");
    for (int i = 0; i < FASHION_BATCH; i++)
        ((int64_t *)nb_data(c.y))[i] = (int64_t)(10 * ((const double *)nb_data(u))[i]);
    c.y = need(nb_persistent(c.y), "nb_persistent");
    nb_scope_end();
    return c;
}

static void fashion_teardown(fashion_ctx *c) {
    nb_free(c->x);
    nb_free(c->y);
    nb_optim_free(c->opt);
    nb_params_free(c->ps);
}

static void bench_fashion(void) {
    section("13. Fashion-MNIST \"2 Conv+pooling\" training step (examples/fashion_mnist.c's "
            "network, batch 64 random images; forward, loss, backward, Adam step)");
    /* multiply-adds of one forward: conv1, conv2, fc1, fc2; a training step
     * is counted as 3 forwards (the input's gradient of conv1 is not needed,
     * so this slightly overstates it) */
    double fwd = 2.0 * FASHION_BATCH *
                 (28 * 28 * 32 * 25.0 + 14 * 14 * 64 * 32 * 25.0 + 3136 * 1024.0 + 1024 * 10.0);
    printf("%-16s %4s %9s %9s %6s %10s %9s %7s %10s\n", "network", "thr", "ms/step", "GFLOP/s",
           "%pk", "epoch s", "pt ms", "nb/pt", "pt epoch s");
    static const char *names[3] = {"2 conv", "2 conv + BN", "2 conv, bf16"};
    static const char *ref_keys[3] = {"fashion_step_ms_%dt", "fashion_bn_step_ms_%dt",
                                      "fashion_bf16_step_ms_%dt"};
    for (int b = 0; b < 3; b++) {
        fashion_ctx c = fashion_setup(b == 1);
        c.bf16 = b == 2; /* autocast: convs and linear layers in bf16, as torch.autocast */
        for (int t = 1; t <= ncpu; t = next_threads(t)) {
            nb_set_num_threads(t);
            double ms = 1e3 * median_time(fashion_step, &c, 2, 11);
            double pt = ref(ref_keys[b], t);
            printf("%-16s %4d", names[b], t);
            cell(ms, 9, 1);
            cell(3 * fwd / (ms * 1e6), 9, 1);
            cell(100 * 3 * fwd / (ms * 1e6) / (t == 1 ? peak_1t : peak_nt), 6, 0);
            cell(FASHION_STEPS_PER_EPOCH * ms * 1e-3, 10, 1);
            cell(pt, 9, 1);
            cell(ratio(ms, pt), 7, 2);
            cell(FASHION_STEPS_PER_EPOCH * pt * 1e-3, 10, 1);
            printf("\n");
        }
        fashion_teardown(&c);
    }
    printf("epoch s = 938 steps x ms/step (training only; the example's test pass adds to it); "
           "%%pk of the f32 FMA peak, also for bf16\n");
}

/* ------------------------------------------------------------------- main */

/* ------------------------------------------------------------ 11. batch norm */

typedef struct {
    nb_tensor *x, *w, *b, *rm, *rv;
    bool backward;
} bn_ctx;

static void bn_run(void *p) {
    bn_ctx *c = p;
    nb_scope_begin();
    nb_tensor *y = nb_batch_norm(c->x, c->rm, c->rv, c->w, c->b, true, 0.1, 1e-5);
    if (!y || (c->backward && nb_backward(nb_sum_all(y)) != 0)) die("nb_batch_norm");
    nb_scope_end();
    nb_clear_grad(c->x);
    nb_clear_grad(c->w);
    nb_clear_grad(c->b);
}

/* nb_batch_norm f32 in training with running statistics (what BatchNorm2d
 * does), forward and forward + backward of y.sum(), at the shapes of the
 * Fashion-MNIST network's two convolutions (batch 64) */
static void bench_batchnorm(void) {
    static const int64_t shapes[2][4] = {{64, 32, 28, 28}, {64, 64, 14, 14}};
    section("11. nb_batch_norm f32, training with running statistics (ms)");
    printf("%-16s %4s %9s %9s %7s %9s %9s %7s\n", "N x C x H x W", "thr", "fwd", "pt fwd",
           "nb/pt", "fwd+bwd", "pt f+b", "nb/pt");
    for (int i = 0; i < 2; i++) {
        const int64_t *s = shapes[i];
        nb_rng r;
        nb_rng_seed(&r, 11);
        bn_ctx c = {.x = leaf_randn(NB_F32, NB_SHAPE(s[0], s[1], s[2], s[3]), true, &r),
                    .w = leaf_randn(NB_F32, NB_SHAPE(s[1]), true, &r),
                    .b = leaf_randn(NB_F32, NB_SHAPE(s[1]), true, &r),
                    .rm = need(nb_zeros(NB_F32, NB_SHAPE(s[1])), "nb_zeros"),
                    .rv = need(nb_ones(NB_F32, NB_SHAPE(s[1])), "nb_ones")};
        char name[40];
        snprintf(name, sizeof name, "%lldx%lldx%lldx%lld", (long long)s[0], (long long)s[1],
                 (long long)s[2], (long long)s[3]);
        for (int t = 1; t <= ncpu; t = next_threads(t)) {
            nb_set_num_threads(t);
            c.backward = false;
            double fwd = 1e3 * median_time(bn_run, &c, 2, 15);
            c.backward = true;
            double fb = 1e3 * median_time(bn_run, &c, 2, 15);
            double pf = ref("bn_fwd_ms_%dt_%s", t, name), pb = ref("bn_fb_ms_%dt_%s", t, name);
            printf("%-16s %4d", name, t);
            cell(fwd, 10, 2);
            cell(pf, 10, 2);
            cell(ratio(fwd, pf), 8, 2);
            cell(fb, 10, 2);
            cell(pb, 10, 2);
            cell(ratio(fb, pb), 8, 2);
            printf("\n");
        }
        nb_free(c.x);
        nb_free(c.w);
        nb_free(c.b);
        nb_free(c.rm);
        nb_free(c.rv);
    }
}

/* `bench` runs every section; `bench 1 3` only sections 1 and 3. */
static bool wanted(int argc, char **argv, int section_no) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; i++)
        if (atoi(argv[i]) == section_no) return true;
    return false;
}

static void print_footer(double start) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak RSS %.1f MiB (ru_maxrss); allocator: %.1f MiB in use, %.1f MiB cached\n",
           (double)ru.ru_maxrss / 1024, (double)nb_memory_allocated() / (1 << 20),
           (double)nb_memory_cached() / (1 << 20));
    printf("load average at the end: %s", loadavg());
    printf("total benchmark time %.1f s\n", now() - start);
}

int main(int argc, char **argv) {
    static void (*const sections[13])(void) = {bench_peak,     bench_matmul, bench_attention,
                                              bench_mha,      bench_overhead, bench_copy,
                                              bench_checkpoint, bench_gpt2, bench_generate,
                                              bench_tokenizer, bench_batchnorm, bench_conv,
                                              bench_fashion};
    if (argc == 8 && !strcmp(argv[1], "--gpt2-child"))
        return gpt2_child(atoi(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]) != 0,
                          atoi(argv[6]) != 0, atoi(argv[7]));
    double start = now();
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    ncpu = n < 1 ? 1 : n > 64 ? 64 : (int)n;
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    snprintf(self_path + (len > 0 ? len : 0), sizeof self_path - (size_t)(len > 0 ? len : 0), "%s",
             len > 0 ? "" : argv[0]);
    load_refs();
    print_header();
    if ((wanted(argc, argv, 8) || wanted(argc, argv, 13)) && !wanted(argc, argv, 1))
        bench_peak(); /* their % of peak */
    for (int i = 0; i < 13; i++)
        if (wanted(argc, argv, i + 1)) sections[i]();
    section("14. process");
    print_footer(start);
    return 0;
}
