/* test_cpu.c: what tensor/cpu.c reads about the CPU's caches and what
 * ops/gemm.c derives from them. The caches found agree with Linux's sysfs
 * where sysfs has them; the sysfs reader on made-up trees (a Sapphire
 * Rapids-like one, a broken one, an implausible one); the cache blocks of
 * every path satisfy the analytical model's invariants for several cache
 * configurations (32K/256K, 48K/2M, 48K/1M, 64K/512K, little associativity,
 * nothing known); and the products are bitwise the same whatever blocks
 * they run with, on every kernel path the CPU has. Nothing here measures a
 * speed. */
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/gemm_internal.h"
#include "tensor/cpu_internal.h"
#include "test_util.h"

#define SYSFS "/sys/devices/system/cpu/cpu0/cache"

/* Under valgrind, its preload library is in LD_PRELOAD (and CPUID answers
 * for valgrind's own model of a CPU, not this one's caches). */
static bool under_valgrind(void) {
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload");
}

/* ----------------------------------------------------------- detection */
START_TEST(caches_agree_with_sysfs) {
    const nbi_cpu *c = nbi_cpu_info();
    ck_assert_ptr_nonnull(c->cache_source);
    printf("cpu           %s: %s; L1d %lld KiB %d-way, L2 %lld KiB %d-way, L3 %lld KiB %d-way "
           "shared by %d, line %lld (from %s)\n", c->name, nbi_isa_name(nbi_isa()),
           (long long)c->l1d >> 10, c->l1d_ways, (long long)c->l2 >> 10, c->l2_ways,
           (long long)c->l3 >> 10, c->l3_ways, c->l3_sharing, (long long)c->line,
           c->cache_source);
    ck_assert_int_ge(c->line, 16);
    nbi_cpu s = {0};
    if (under_valgrind() || nbi_cpu_caches_sysfs(&s, SYSFS) != 0) {
        /* no sysfs here, or valgrind's CPUID: whatever was found is sane */
        ck_assert(c->l1d == 0 || (c->l1d >= 1024 && (c->l2 == 0 || c->l2 > c->l1d)));
        return;
    }
    ck_assert_int_gt(c->l1d, 0); /* sysfs alone would have given it */
    ck_assert_int_eq(c->l1d, s.l1d);
    if (s.l2 && c->l2) ck_assert_int_eq(c->l2, s.l2);
    if (s.l3 && c->l3) ck_assert_int_eq(c->l3, s.l3);
    if (s.l1d_ways && c->l1d_ways) ck_assert_int_eq(c->l1d_ways, s.l1d_ways);
    if (s.l2_ways && c->l2_ways) ck_assert_int_eq(c->l2_ways, s.l2_ways);
    if (s.l3_ways && c->l3_ways) ck_assert_int_eq(c->l3_ways, s.l3_ways);
    ck_assert_int_eq(c->line, s.line);
    /* a level sysfs knows is known */
    ck_assert(!s.l2 || c->l2);
    ck_assert(!s.l3 || c->l3);
}
END_TEST

static void put(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    test_write_bytes(path, text, strlen(text));
}

/* One indexN folder of a made-up sysfs cache tree; NULL values are left out. */
static void fake_index(const char *root, int i, const char *level, const char *type,
                       const char *size, const char *ways, const char *line,
                       const char *shared) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/index%d", root, i);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    if (level) put(dir, "level", level);
    if (type) put(dir, "type", type);
    if (size) put(dir, "size", size);
    if (ways) put(dir, "ways_of_associativity", ways);
    if (line) put(dir, "coherency_line_size", line);
    if (shared) put(dir, "shared_cpu_list", shared);
}

START_TEST(sysfs_reader_on_made_up_trees) {
    test_make_tmp_dir("cpu");
    char root[128];
    snprintf(root, sizeof root, "%s/good", test_tmp_dir);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    fake_index(root, 0, "1\n", "Data\n", "48K\n", "12\n", "64\n", "0,56\n");
    fake_index(root, 1, "1\n", "Instruction\n", "32K\n", "8\n", "64\n", "0,56\n");
    fake_index(root, 2, "2\n", "Unified\n", "2048K\n", "16\n", "64\n", "0,56\n");
    fake_index(root, 3, "3\n", "Unified\n", "107520K\n", "15\n", "64\n", "0-55,112-167\n");
    nbi_cpu c = {.detected = 7, .line = 1};
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&c, root), 0);
    ck_assert_int_eq(c.detected, 7); /* only the cache fields are written */
    ck_assert_int_eq(c.l1d, 48 << 10);
    ck_assert_int_eq(c.l1d_ways, 12);
    ck_assert_int_eq(c.l1d_sharing, 2);
    ck_assert_int_eq(c.l2, 2 << 20);
    ck_assert_int_eq(c.l2_ways, 16);
    ck_assert_int_eq(c.l3, (int64_t)107520 << 10);
    ck_assert_int_eq(c.l3_ways, 15);
    ck_assert_int_eq(c.l3_sharing, 112);
    ck_assert_int_eq(c.line, 64);

    /* no data cache: nothing found, nothing written */
    snprintf(root, sizeof root, "%s/icache", test_tmp_dir);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    fake_index(root, 0, "1", "Instruction", "32K", "8", "64", "0");
    fake_index(root, 1, "2", "Unified", NULL, "8", "64", "0"); /* no size */
    nbi_cpu d = {.l1d = 5};
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&d, root), -1);
    ck_assert_int_eq(d.l1d, 5);
    /* an L2 smaller than the L1d, or a size that is not one: not believed */
    snprintf(root, sizeof root, "%s/odd", test_tmp_dir);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    fake_index(root, 0, "1", "Data", "64K", "8", "64", "0");
    fake_index(root, 1, "2", "Unified", "32K", "8", "64", "0");
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&d, root), -1);
    snprintf(root, sizeof root, "%s/junk", test_tmp_dir);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    fake_index(root, 0, "1", "Data", "48Q", "12", "64", "0");
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&d, root), -1);
    /* missing ways and sharing: 0 (not known), the sizes still read */
    snprintf(root, sizeof root, "%s/bare", test_tmp_dir);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    fake_index(root, 0, "1", "Data", "32K", NULL, NULL, NULL);
    fake_index(root, 2, "2", "Unified", "1M", "0", "64", "x");
    nbi_cpu e = {.line = 64};
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&e, root), 0);
    ck_assert_int_eq(e.l1d, 32 << 10);
    ck_assert_int_eq(e.l1d_ways, 0);
    ck_assert_int_eq(e.l2, 1 << 20);
    ck_assert_int_eq(e.l2_ways, 0);
    ck_assert_int_eq(e.l2_sharing, 0);
    ck_assert_int_eq(e.l3, 0);
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&e, "/nonexistent/cache"), -1);
    ck_assert_int_eq(nbi_cpu_caches_sysfs(&e, NULL), -1);
    test_remove_tmp_dir();
}
END_TEST

/* ------------------------------------------------------------- blocking */
typedef struct {
    const char *name;
    nbi_cpu c;
} fake_cpu;

#define KiB(x) ((int64_t)(x) << 10)
#define MiB(x) ((int64_t)(x) << 20)
static const fake_cpu fakes[] = {
    {"32K/256K (Haswell)", {.l1d = KiB(32), .l1d_ways = 8, .l2 = KiB(256), .l2_ways = 8,
                            .l3 = MiB(8), .l3_ways = 16, .l3_sharing = 8, .line = 64}},
    {"48K/2M (Sapphire Rapids)", {.l1d = KiB(48), .l1d_ways = 12, .l2 = MiB(2), .l2_ways = 16,
                                  .l3 = MiB(105), .l3_ways = 15, .l3_sharing = 2, .line = 64}},
    {"48K/1M (Zen 5)", {.l1d = KiB(48), .l1d_ways = 12, .l2 = MiB(1), .l2_ways = 16,
                        .l3 = MiB(32), .l3_ways = 16, .l3_sharing = 2, .line = 64}},
    {"64K/512K", {.l1d = KiB(64), .l1d_ways = 4, .l2 = KiB(512), .l2_ways = 8, .l3 = MiB(16),
                  .l3_ways = 16, .l3_sharing = 16, .line = 64}},
    {"32K/1M, no L3", {.l1d = KiB(32), .l1d_ways = 8, .l2 = MiB(1), .l2_ways = 16, .line = 64}},
    {"16K 2-way/64K 4-way", {.l1d = KiB(16), .l1d_ways = 2, .l2 = KiB(64), .l2_ways = 4,
                             .l3 = KiB(256), .l3_ways = 2, .line = 64}},
    {"unknown (0)", {0}},
};
#define NFAKES (int)(sizeof fakes / sizeof fakes[0])

/* Every path's register tile: mr, nr, element bytes. */
static const int tiles[][3] = {{4, 8, 4}, {4, 4, 8}, {6, 16, 4}, {6, 8, 8}, {8, 32, 4}, {8, 16, 8},
                                {8, 12, 4}, {8, 6, 8}}; /* portable, AVX2, AVX-512, NEON */
#define NTILES (int)(sizeof tiles / sizeof tiles[0])

START_TEST(blocks_satisfy_the_model_for_fake_cpus) {
    const fake_cpu *f = &fakes[_i];
    /* what the model assumes where the CPU tells nothing */
    const int64_t l1 = f->c.l1d ? f->c.l1d : KiB(32), l2 = f->c.l2 ? f->c.l2 : MiB(1);
    const int64_t l3 = f->c.l3 ? f->c.l3 : MiB(8);
    const int64_t w1 = f->c.l1d_ways ? f->c.l1d_ways : 8, w2 = f->c.l2_ways ? f->c.l2_ways : 16;
    int64_t share = l3 / (f->c.l3_sharing > 1 ? f->c.l3_sharing : 1);
    if (share > 4 * l2) share = 4 * l2;
    for (int t = 0; t < NTILES; t++) {
        const int mr = tiles[t][0], nr = tiles[t][1], s = tiles[t][2];
        nbi_gemm_blocks b = nbi_gemm_blocking(&f->c, mr, nr, s);
        printf("blocks        %-26s %dx%-2d %s: kc %4lld  mc %4lld  nc %5lld\n", f->name, mr, nr,
               s == 4 ? "f32" : "f64", (long long)b.kc, (long long)b.mc, (long long)b.nc);
        ck_assert_int_eq(b.mr, mr);
        ck_assert_int_eq(b.nr, nr);
        /* whole steps: kc in 8s, mc in tiles of rows, nc in panels of columns */
        ck_assert_int_ge(b.kc, 8);
        ck_assert_int_eq(b.kc % 8, 0);
        ck_assert_int_ge(b.mc, mr);
        ck_assert_int_eq(b.mc % mr, 0);
        ck_assert_int_ge(b.nc, nr);
        ck_assert_int_eq(b.nc % nr, 0);
        /* L1: a micro-panel of B and one of A, with a way to spare (or, for
         * a cache of few ways, half of it) */
        int64_t panels = b.kc * (mr + nr) * s;
        if (b.kc > 8) ck_assert_msg(panels <= l1 - l1 / w1 || panels <= l1 / 2,
                                    "kc %lld: panels of %lld bytes in an L1 of %lld",
                                    (long long)b.kc, (long long)panels, (long long)l1);
        /* L2: the block of A, its column of C and two panels of B */
        int64_t in_l2 = b.mc * (b.kc + nr) * s + 2 * b.kc * nr * s;
        if (b.mc > mr) ck_assert_msg(in_l2 <= l2, "mc %lld: %lld bytes in an L2 of %lld",
                                     (long long)b.mc, (long long)in_l2, (long long)l2);
        /* L3: the block of B within the core's share, beside the block of A */
        if (b.nc > nr) ck_assert_msg(b.kc * b.nc * s + b.mc * b.kc * s <= share,
                                     "nc %lld: B block %lld bytes in a share of %lld",
                                     (long long)b.nc, (long long)(b.kc * b.nc * s),
                                     (long long)share);
        /* the model uses what it is given: more L2 never means a smaller A block */
        nbi_cpu bigger = f->c;
        bigger.l2 = 2 * l2;
        bigger.l2_ways = (int)w2;
        if (!bigger.l1d) bigger.l1d = l1, bigger.l1d_ways = (int)w1;
        nbi_gemm_blocks b2 = nbi_gemm_blocking(&bigger, mr, nr, s);
        ck_assert_int_eq(b2.kc, b.kc);
        ck_assert_int_ge(b2.mc, b.mc);
    }
}
END_TEST

START_TEST(unknown_caches_are_the_documented_defaults) {
    const nbi_cpu def = {.l1d = KiB(32), .l1d_ways = 8, .l2 = MiB(1), .l2_ways = 16,
                         .l3 = MiB(8), .l3_ways = 16, .line = 64};
    const nbi_cpu none = {0};
    for (int t = 0; t < NTILES; t++) {
        nbi_gemm_blocks a = nbi_gemm_blocking(&none, tiles[t][0], tiles[t][1], tiles[t][2]);
        nbi_gemm_blocks b = nbi_gemm_blocking(&def, tiles[t][0], tiles[t][1], tiles[t][2]);
        nbi_gemm_blocks c = nbi_gemm_blocking(NULL, tiles[t][0], tiles[t][1], tiles[t][2]);
        ck_assert(a.kc == b.kc && a.mc == b.mc && a.nc == b.nc);
        ck_assert(c.kc == b.kc && c.mc == b.mc && c.nc == b.nc);
    }
}
END_TEST

/* The blocks in use are the model's for this CPU. */
START_TEST(blocks_in_use_come_from_this_cpu) {
    for (int f64 = 0; f64 <= 1; f64++) {
        nbi_gemm_blocks u = nbi_gemm_blocks_of(f64);
        nbi_gemm_blocks m = nbi_gemm_blocking(nbi_cpu_info(), u.mr, u.nr, f64 ? 8 : 4);
        printf("blocks        in use (%s, %s): %dx%d tile, kc %lld  mc %lld  nc %lld\n",
               f64 ? "f64" : "f32", nbi_isa_name(nbi_isa()), u.mr, u.nr, (long long)u.kc,
               (long long)u.mc, (long long)u.nc);
        ck_assert(u.kc == m.kc && u.mc == m.mc && u.nc == m.nc);
    }
}
END_TEST

/* A read in place at a stride: the rows kept per block leave no L2 set with
 * more of A's lines than the block's share of ways, counted line by line
 * here too, when some row count can (rows of A: unless mr rows already
 * overflow; rows of A^T: unless the stride repeats within kc), and never
 * more rows than the model's mc. */
START_TEST(in_place_a_fits_the_l2_sets) {
    static const int64_t strides[] = {1, 64, 512, 768, 1000, 1024, 2048, 2304, 3072, 4096,
                                      50257, 65536};
    const fake_cpu *f = &fakes[_i];
    const int64_t line = 64, l2 = f->c.l2 ? f->c.l2 : MiB(1);
    const int64_t w2 = f->c.l2 && f->c.l2_ways ? f->c.l2_ways : 16, way = l2 / w2;
    const int64_t sets = way / line;
    int *count = calloc((size_t)sets, sizeof *count);
    ck_assert_ptr_nonnull(count);
    for (int t = 0; t < NTILES; t++) {
        const int mr = tiles[t][0], nr = tiles[t][1], s = tiles[t][2];
        nbi_gemm_blocks b = nbi_gemm_blocking(&f->c, mr, nr, s);
        int64_t bw = (b.kc * nr * s + way - 1) / way;
        int64_t a_ways = (w2 - 1 - 2 * bw) * b.kc / (b.kc + nr);
        for (size_t k = 0; k < sizeof strides / sizeof strides[0]; k++) {
            for (int at = 0; at <= 1; at++) {
                int64_t mc = nbi_gemm_mc_in_place(&f->c, &b, s, at, strides[k], 0, INT64_MAX);
                ck_assert_int_le(mc, b.mc);
                ck_assert_int_ge(mc, mr);
                ck_assert_int_eq(mc % mr, 0);
                if (a_ways < 1) continue;
                /* runs of A's block: rows of A (mc of kc elements) or of A^T
                 * (kc of mc), a stride apart, from an address 0 mod 4 KiB */
                int64_t runs = at ? b.kc : mc, len = (at ? mc : b.kc) * s;
                if (strides[k] * s < len) continue; /* runs overlap: not a layout of A */
                memset(count, 0, (size_t)sets * sizeof *count);
                int worst = 0;
                for (int64_t r = 0; r < runs; r++) {
                    int64_t first = r * strides[k] * s / line;
                    int64_t last = (r * strides[k] * s + len - 1) / line;
                    for (int64_t l = first; l <= last && l < first + sets; l++) {
                        int c = ++count[l % sets];
                        if (c > worst) worst = c;
                    }
                }
                if ((mc < b.mc || !at) && mc > mr) /* mr rows: the fewest, fitting or not */
                    ck_assert_msg(worst <= a_ways, "%s %dx%d %s stride %lld: mc %lld puts %d "
                                  "lines in a set of %lld ways for A", f->name, mr, nr,
                                  at ? "A^T" : "A", (long long)strides[k], (long long)mc, worst,
                                  (long long)a_ways);
            }
        }
    }
    free(count);
}
END_TEST

/* ------------------------------------------- the same bits for any blocks */
static void fill(void *p, int64_t n, int f64, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        double v = (double)(int64_t)(seed >> 11) / (double)((int64_t)1 << 52) - 1.0;
        if (f64) ((double *)p)[i] = v;
        else ((float *)p)[i] = (float)v;
    }
}

/* C = A B for M x N x K with A row-major or transposed, B row-major or
 * transposed, into c (M x N). */
static void product(int f64, int64_t M, int64_t N, int64_t K, int at, int bt, const void *a,
                    const void *b, void *c) {
    nbi_gemm_ws ws = {0};
    int64_t sam = at ? 1 : K, sak = at ? M : 1, sbk = bt ? 1 : N, sbn = bt ? K : 1;
    int rc = f64 ? nbi_gemm_f64(&ws, M, N, K, a, sam, sak, b, sbk, sbn, c, N, 1)
                 : nbi_gemm_f32(&ws, M, N, K, a, sam, sak, b, sbk, sbn, c, N, 1);
    ck_assert_int_eq(rc, 0);
    nbi_gemm_ws_free(&ws);
}

START_TEST(products_have_the_same_bits_for_any_blocks) {
    static const int64_t shapes[][3] = {{37, 45, 529}, {130, 70, 300}, {9, 600, 77},
                                        {3, 5, 1000}, {203, 97, 45}};
#if defined(__aarch64__)
    const int paths[] = {NBI_GEMM_PORTABLE, NBI_GEMM_NEON, NBI_GEMM_SVE};
#else
    const int paths[] = {NBI_GEMM_PORTABLE, NBI_GEMM_AVX2, NBI_GEMM_AVX512};
#endif
    for (int p = 0; p < 3 && nbi_gemm_path(paths[p]) == paths[p]; p++) {
        for (int f64 = 0; f64 <= 1; f64++) {
            nbi_gemm_blocks u = nbi_gemm_blocks_of(f64);
            /* the fake CPUs' blocks, and tiny ones that cut everything */
            nbi_gemm_blocks alt[NFAKES + 2];
            int nalt = 0;
            for (int f = 0; f < NFAKES; f++)
                alt[nalt++] = nbi_gemm_blocking(&fakes[f].c, u.mr, u.nr, f64 ? 8 : 4);
            alt[nalt++] = (nbi_gemm_blocks){.kc = 8, .mc = 1, .nc = 1};
            alt[nalt++] = (nbi_gemm_blocks){.kc = 24, .mc = 3 * u.mr, .nc = 2 * u.nr};
            size_t nshapes = under_valgrind() ? 2 : sizeof shapes / sizeof shapes[0];
            for (size_t s = 0; s < nshapes; s++) {
                int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                size_t es = f64 ? 8 : 4;
                void *a = malloc(es * M * K), *b = malloc(es * K * N);
                void *c0 = malloc(es * M * N), *c1 = malloc(es * M * N);
                ck_assert(a && b && c0 && c1);
                fill(a, M * K, f64, 11 + s);
                fill(b, K * N, f64, 29 + s);
                for (int lay = 0; lay < 4; lay++) {
                    int at = lay & 1, bt = lay >> 1;
                    ck_assert_int_eq(nbi_gemm_blocks_force(f64, NULL), 0);
                    product(f64, M, N, K, at, bt, a, b, c0);
                    for (int k = 0; k < nalt; k++) {
                        ck_assert_int_eq(nbi_gemm_blocks_force(f64, &alt[k]), 0);
                        memset(c1, 0xff, es * M * N);
                        product(f64, M, N, K, at, bt, a, b, c1);
                        ck_assert_msg(!memcmp(c0, c1, es * M * N),
                                      "%s path %d, %lldx%lldx%lld layout %d: blocks kc %lld mc "
                                      "%lld nc %lld change the bits", f64 ? "f64" : "f32",
                                      paths[p], (long long)M, (long long)N, (long long)K, lay,
                                      (long long)alt[k].kc, (long long)alt[k].mc,
                                      (long long)alt[k].nc);
                    }
                }
                free(a), free(b), free(c0), free(c1);
            }
            ck_assert_int_eq(nbi_gemm_blocks_force(f64, NULL), 0);
            nbi_gemm_blocks back = nbi_gemm_blocks_of(f64);
            ck_assert(back.kc == u.kc && back.mc == u.mc && back.nc == u.nc);
        }
    }
    nbi_gemm_path(NBI_GEMM_AUTO);
    nbi_gemm_blocks bad = {.kc = 0, .mc = 8, .nc = 8};
    ck_assert_int_eq(nbi_gemm_blocks_force(0, &bad), -1);
}
END_TEST

/* aarch64: every path's products are chains of fused multiply-adds over k in
 * order from 0 (the portable path's multiply-adds contracted), so NEON and
 * SVE (at whatever vector length this runs with) give the portable path's
 * bits, for each layout of A and B, edge tiles in both directions, K past
 * one block, and C a strided view. Elsewhere: nothing to compare. */
START_TEST(arm_paths_have_the_portable_bits) {
#if defined(__aarch64__)
    static const int64_t shapes[][3] = {{37, 45, 529}, {8, 12, 3}, {4, 6, 1}, {9, 25, 77},
                                        {130, 70, 300}, {3, 100, 20}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int f64 = 0; f64 <= 1; f64++) {
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            size_t es = f64 ? 8 : 4;
            void *a = malloc(es * M * K), *b = malloc(es * K * N);
            void *c[3] = {malloc(es * M * N), malloc(es * M * N), malloc(es * M * N)};
            ck_assert(a && b && c[0] && c[1] && c[2]);
            fill(a, M * K, f64, 5 + s);
            fill(b, K * N, f64, 7 + s);
            for (int lay = 0; lay < 4; lay++) {
                const int paths[3] = {NBI_GEMM_PORTABLE, NBI_GEMM_NEON, NBI_GEMM_SVE};
                int used[3];
                for (int p = 0; p < 3; p++) {
                    used[p] = nbi_gemm_path(paths[p]);
                    memset(c[p], 0xff, es * M * N);
                    product(f64, M, N, K, lay & 1, lay >> 1, a, b, c[p]);
                }
                ck_assert_int_eq(used[0], NBI_GEMM_PORTABLE);
                /* every aarch64 CPU has NEON, unless NABLA_ISA=portable caps it */
                ck_assert_int_eq(used[1], nbi_isa() >= NBI_ISA_NEON ? NBI_GEMM_NEON
                                                                    : NBI_GEMM_PORTABLE);
                for (int p = 1; p < 3; p++)
                    ck_assert_msg(!memcmp(c[0], c[p], es * M * N),
                                  "%s %lldx%lldx%lld layout %d: path %d differs from portable",
                                  f64 ? "f64" : "f32", (long long)M, (long long)N, (long long)K,
                                  lay, used[p]);
            }
            free(a), free(b), free(c[0]), free(c[1]), free(c[2]);
        }
    nbi_gemm_path(NBI_GEMM_AUTO);
#endif
}
END_TEST

/* The aarch64 detection's pure parts: Linux's hwcap bits to features and
 * path, MIDR parts to names, /proc/cpuinfo's fields. (On an aarch64 CPU the
 * path detected is also checked by hand under qemu: -cpu max gives sve,
 * -cpu cortex-a57 neon.) */
START_TEST(arm_hwcaps_parts_and_cpuinfo) {
    /* Neoverse-N1: fp asimd ... fphp asimdhp cpuid (hwcap 0x...ff of Linux) */
    unsigned n1 = nbi_cpu_arm_features((1ul << 0) | (1ul << 1) | (1ul << 9) | (1ul << 10) |
                                           (1ul << 11), 0);
    ck_assert_uint_eq(n1, NBI_CPU_ASIMD | NBI_CPU_FPHP);
    ck_assert_int_eq(nbi_cpu_arm_path(n1, 0), 1); /* neon */
    /* half precision needs both halves */
    ck_assert_uint_eq(nbi_cpu_arm_features((1ul << 1) | (1ul << 9), 0), NBI_CPU_ASIMD);
    /* Neoverse-V1: sve (hwcap bit 22), bf16 and i8mm (hwcap2 bits 14, 13) */
    unsigned v1 = nbi_cpu_arm_features((1ul << 1) | (1ul << 22), (1ul << 14) | (1ul << 13));
    ck_assert_uint_eq(v1, NBI_CPU_ASIMD | NBI_CPU_SVE | NBI_CPU_BF16 | NBI_CPU_I8MM);
    ck_assert_int_eq(nbi_cpu_arm_path(v1, 32), 3);  /* sve */
    ck_assert_int_eq(nbi_cpu_arm_path(v1, 0), 2);   /* no vector length: neon-bf16 */
    /* sve2 (hwcap2 bit 1) and sme (bit 23) */
    ck_assert_uint_eq(nbi_cpu_arm_features(0, (1ul << 1) | (1ul << 23)), NBI_CPU_SVE2 | NBI_CPU_SME);
    ck_assert_int_eq(nbi_cpu_arm_path(NBI_CPU_ASIMD | NBI_CPU_BF16, 0), 2);
    ck_assert_int_eq(nbi_cpu_arm_path(NBI_CPU_ASIMD | NBI_CPU_SVE, 64), 3); /* A64FX: no bf16 */
    ck_assert_int_eq(nbi_cpu_arm_path(0, 0), 0);
    ck_assert_int_eq(nbi_cpu_arm_features(~0ul & ~((1ul << 1) | (1ul << 9) | (1ul << 10) |
                                                   (1ul << 22)), 0), 0);

    char name[64];
    nbi_cpu_arm_name(0x41, 0xd0c, name, sizeof name);
    ck_assert_str_eq(name, "ARM Neoverse-N1");
    nbi_cpu_arm_name(0x41, 0xd4f, name, sizeof name);
    ck_assert_str_eq(name, "ARM Neoverse-V2");
    nbi_cpu_arm_name(0x46, 0x001, name, sizeof name);
    ck_assert_str_eq(name, "Fujitsu A64FX");
    nbi_cpu_arm_name(0x41, 0x123, name, sizeof name);
    ck_assert_str_eq(name, "aarch64 implementer 0x41 part 0x123");
    nbi_cpu_arm_name(0, 0, name, sizeof name);
    ck_assert_str_eq(name, "aarch64 implementer 0x00 part 0x000");

    unsigned impl = 0, part = 0;
    const char *info = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm\n"
                       "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\n"
                       "CPU part\t: 0xd0c\nCPU revision\t: 1\n\nprocessor\t: 1\n"
                       "CPU implementer\t: 0x61\nCPU part\t: 0x023\n";
    ck_assert_int_eq(nbi_cpu_arm_cpuinfo(info, &impl, &part), 0);
    ck_assert_uint_eq(impl, 0x41);
    ck_assert_uint_eq(part, 0xd0c);
    ck_assert_int_eq(nbi_cpu_arm_cpuinfo("processor\t: 0\nvendor_id\t: GenuineIntel\n", &impl, &part), -1);
    ck_assert_int_eq(nbi_cpu_arm_cpuinfo("CPU implementer\t: 0x41\n", &impl, &part), -1);
    ck_assert_int_eq(nbi_cpu_arm_cpuinfo("CPU part: 0xd0c\nCPU implementer:0x48\n", &impl, &part), 0);
    ck_assert_uint_eq(impl, 0x48);
    ck_assert_uint_eq(part, 0xd0c);
    ck_assert_int_eq(nbi_cpu_arm_cpuinfo(NULL, &impl, &part), -1);
#if defined(__aarch64__)
    /* this CPU: the path follows its features, the vector length is SVE's */
    const nbi_cpu *c = nbi_cpu_info();
    ck_assert(c->features & NBI_CPU_ASIMD);
    ck_assert_int_eq(c->detected, nbi_cpu_arm_path(c->features, c->sve_bytes));
    if (c->features & NBI_CPU_SVE) ck_assert(c->sve_bytes >= 16 && c->sve_bytes % 16 == 0);
    else ck_assert_int_eq(c->sve_bytes, 0);
    ck_assert_str_ne(c->name, "");
#endif
}
END_TEST

/* ------------------------------------------------------------ the cache */

/* Freed storage past NABLA_CACHE_MB's default 1 GiB is kept when the
 * process has had that much in use at once: a step of 1.5 GiB of buffers
 * finds them all again. The buffers are never written, so no page is
 * touched. In a child (the cache is process-wide); not under sanitizers or
 * valgrind (no recycling there, or their own bookkeeping of 1.5 GiB). */
START_TEST(cache_keeps_what_the_peak_had) {
    if (UNDER_ASAN || UNDER_TSAN || getenv("NABLA_CACHE_MB") || under_valgrind()) return;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        nb_empty_cache();
        nb_tensor *t[3];
        for (int i = 0; i < 3; i++)
            if (!(t[i] = nb_empty(NB_F32, NB_SHAPE(1 << 27)))) _exit(2); /* 512 MiB each */
        for (int i = 0; i < 3; i++) nb_free(t[i]);
        if (nb_memory_cached() != (int64_t)3 << 29) _exit(3); /* all 1.5 GiB kept */
        for (int i = 0; i < 3; i++) /* and found again: nothing new from the system */
            if (!(t[i] = nb_empty(NB_F32, NB_SHAPE(1 << 27)))) _exit(4);
        if (nb_memory_cached() != 0) _exit(5);
        for (int i = 0; i < 3; i++) nb_free(t[i]);
        nb_empty_cache();
        _exit(nb_memory_cached() == 0 ? 0 : 6);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}
END_TEST

Suite *suite_cpu(void) {
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, caches_agree_with_sysfs);
    tcase_add_test(tc, sysfs_reader_on_made_up_trees);
    tcase_add_loop_test(tc, blocks_satisfy_the_model_for_fake_cpus, 0, NFAKES);
    tcase_add_test(tc, unknown_caches_are_the_documented_defaults);
    tcase_add_test(tc, blocks_in_use_come_from_this_cpu);
    tcase_add_loop_test(tc, in_place_a_fits_the_l2_sets, 0, NFAKES);
    tcase_add_test(tc, products_have_the_same_bits_for_any_blocks);
    tcase_add_test(tc, arm_paths_have_the_portable_bits);
    tcase_add_test(tc, arm_hwcaps_parts_and_cpuinfo);
    tcase_add_test(tc, cache_keeps_what_the_peak_had);
    suite_add_tcase(s, tc);
    return s;
}
