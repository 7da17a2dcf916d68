/* test_gpt_torch.c: (being written) */
#include "test_util.h"

START_TEST(gpt_torch_placeholder) {
    nb_GPT m;
    nb_params *ps = nb_params_new();
    nb_GPTConfig cfg = {.vocab_size = 10, .block_size = 8, .n_layer = 1, .n_head = 3, .n_embd = 8};
    expect_error_rc(nb_gpt_init(&m, ps, &cfg, NULL), "nb_gpt_init: n_embd 8 is not divisible by n_head 3");
    nb_params_free(ps);
}
END_TEST

Suite *suite_gpt_torch(void) {
    Suite *s = suite_create("gpt_torch");
    TCase *tc = tcase_create("gpt_torch");
    tcase_add_test(tc, gpt_torch_placeholder);
    suite_add_tcase(s, tc);
    return s;
}
