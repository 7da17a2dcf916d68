/* run_tests.c: every Check suite in one runner. CK_RUN_SUITE=name runs one;
 * CK_RUN_SUITE="name1 name2" (spaces or commas) runs those, one after the
 * other; a named suite that runs no test (a misspelt name) fails the run. */
#include "test_util.h"

#include <stdlib.h>

#include "tensor/cpu_internal.h" /* NB_TEST_PRINT_CPU */

static SRunner *all_suites(void) {
    SRunner *sr = srunner_create(suite_tensor());
    srunner_add_suite(sr, suite_randn());
    srunner_add_suite(sr, suite_views());
    srunner_add_suite(sr, suite_elementwise());
    srunner_add_suite(sr, suite_reduce());
    srunner_add_suite(sr, suite_matmul());
    srunner_add_suite(sr, suite_gemm_bf16());
    srunner_add_suite(sr, suite_cpu());
    srunner_add_suite(sr, suite_registry());
    srunner_add_suite(sr, suite_bf16());
    srunner_add_suite(sr, suite_softmax());
    srunner_add_suite(sr, suite_pool());
    srunner_add_suite(sr, suite_conv());
    srunner_add_suite(sr, suite_sizes());
    srunner_add_suite(sr, suite_edges());
    srunner_add_suite(sr, suite_autograd());
    srunner_add_suite(sr, suite_function());
    srunner_add_suite(sr, suite_recompute());
    srunner_add_suite(sr, suite_higher_order());
    srunner_add_suite(sr, suite_second_order());
    srunner_add_suite(sr, suite_callbacks());
    srunner_add_suite(sr, suite_errors());
    srunner_add_suite(sr, suite_scope());
    srunner_add_suite(sr, suite_nn());
    srunner_add_suite(sr, suite_batchnorm());
    srunner_add_suite(sr, suite_attention());
    srunner_add_suite(sr, suite_rnn());
    srunner_add_suite(sr, suite_conv_module());
    srunner_add_suite(sr, suite_optim());
    srunner_add_suite(sr, suite_schedule());
    srunner_add_suite(sr, suite_transformer());
    srunner_add_suite(sr, suite_gpt());
    srunner_add_suite(sr, suite_gpt_io());
    srunner_add_suite(sr, suite_gpt_torch());
    srunner_add_suite(sr, suite_tokens());
    srunner_add_suite(sr, suite_idx());
    srunner_add_suite(sr, suite_byteorder());
    srunner_add_suite(sr, suite_tokenizer());
    srunner_add_suite(sr, suite_checkpoint());
    srunner_add_suite(sr, suite_handles());
    srunner_add_suite(sr, suite_threads());
    srunner_add_suite(sr, suite_concurrency());
    srunner_add_suite(sr, suite_soak());
    return sr;
}

/* The suites that CK_RUN_SUITE names (all when unset), run; the number of
 * failed tests, or 1 when a named suite ran none. */
static int run(const char *name) {
    SRunner *sr = all_suites();
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    if (name && srunner_ntests_run(sr) == 0) {
        fprintf(stderr, "run_tests: no test ran in suite \"%s\" (CK_RUN_SUITE; CK_RUN_CASE \"%s\")\n",
                name, getenv("CK_RUN_CASE") ? getenv("CK_RUN_CASE") : "");
        failed++;
    }
    srunner_free(sr);
    return failed;
}

int main(void) {
    /* test_concurrency.c runs this binary to read the cache limit, thread
     * count and path that values of NABLA_CACHE_MB, NABLA_NUM_THREADS and
     * NABLA_ISA give (each read once per process) */
    /* make test-isa: the vector path the kernels take here */
    if (getenv("NB_TEST_PRINT_ISA")) {
        printf("%s\n", nb_cpu_isa());
        return 0;
    }
    /* make test-arm: the path in use, the CPU's best and its SVE vector
     * length in bytes (0 without SVE) */
    if (getenv("NB_TEST_PRINT_CPU")) {
        const nbi_cpu *c = nbi_cpu_info();
        printf("%s %s %d\n", nb_cpu_isa(), nbi_isa_name(c->detected), c->sve_bytes);
        return 0;
    }
    if (getenv("NB_TEST_PRINT_THREADS")) {
        printf("%d\n", nb_num_threads());
        return 0;
    }
    if (getenv("NB_TEST_PRINT_CACHE_LIMIT")) {
        printf("%lld\n", (long long)nb_memory_cache_limit());
        return 0;
    }
    if (getenv("NB_TEST_PRINT_CALLBACK_TABLE")) { /* make callback-table */
        print_callback_table(stdout);
        return 0;
    }
    /* make op-table: the registry's op tables, for docs/ops.md and README.md */
    const char *table = getenv("NB_TEST_PRINT_OP_TABLE");
    if (table) {
        print_op_table(table);
        return 0;
    }
    /* Check ends a test that runs past its case's timeout (4 s unless the
     * case sets one) and fails it. A timeout here is a hang guard, never a
     * speed bound: each is at least 40 times the slowest test of its case
     * measured on a busy machine (make test beside two busy loops or stress
     * and other builds on 2 cores, load 3-11; docs/testing.md), so that load
     * cannot reach it and only a hang does. Cases that set none get 120 s;
     * the environment's CK_DEFAULT_TIMEOUT (and CK_TIMEOUT_MULTIPLIER, for
     * every case) still win. Check reads the variable in tcase_create: the
     * suites are made after it (run). */
    setenv("CK_DEFAULT_TIMEOUT", "120", 0);
    const char *names = getenv("CK_RUN_SUITE");
    if (!names || !*names) return run(NULL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    /* Check runs the one suite CK_RUN_SUITE names: set to each in turn */
    char list[1024], *save = NULL;
    snprintf(list, sizeof list, "%s", names);
    int failed = 0;
    for (char *n = strtok_r(list, " ,", &save); n; n = strtok_r(NULL, " ,", &save)) {
        setenv("CK_RUN_SUITE", n, 1);
        failed += run(n);
    }
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
