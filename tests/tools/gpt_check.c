/* gpt_check.c: one AdamW step of nabla's GPT-2 against PyTorch's (make gpt-check).
 *
 *   gpt_check --config small|gpt2 --fixture tests/fixtures/gpt_torch.txt
 *             (--llmc FILE --tokens FILE | --generated) [--threads K]
 *
 * Loads the llm.c checkpoint and token file that gen_gpt_files wrote (or,
 * with --generated, sets the weights and tokens straight from
 * tests/gpt_files.h, which tells loader problems from numeric ones), takes
 * the first batch (tokens [0, B*T]), and runs the step of
 * tests/fixtures/gen_gpt.py: nb_adamw(lr, betas, eps, wd) with
 * nb_gpt_set_weight_decay, nb_backward, nb_optim_step. Checks that the
 * loaded weights are bitwise the generator's, and compares with the
 * fixture: the loss before and after the step within 1e-4 relative, every
 * tensor's gradient and update L2 norms within 1e-4 relative, and the
 * sampled updated values within gf_compare_param's tolerance. One summary
 * line per check; exit status 0 when all pass, 1 otherwise. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla.h"
#include "../gpt_files.h"

#define REL_TOL 1e-4

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fails;
static void report(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("gpt-check: ");
    vprintf(fmt, ap);
    printf(": %s\n", ok ? "ok" : "FAIL");
    va_end(ap);
    fails += !ok;
}

static int usage(const char *prog) {
    fprintf(stderr, "usage: %s --config small|gpt2 --fixture FILE (--llmc FILE --tokens FILE | "
                    "--generated) [--threads K]\n", prog);
    return 2;
}

static double rel(double got, double want) { return fabs(got - want) / fabs(want); }

/* Sets every parameter to the generator's values (no file). */
static int set_generated(const gf_config *c, nb_params *ps) {
    for (int t = 0; t < gf_n_tensors(c); t++) {
        gf_tensor ti = gf_tensor_info(c, t);
        nb_tensor *p = nb_params_get(ps, ti.name);
        if (!p || nb_numel(p) != ti.rows * ti.cols || nb_dtype_of(p) != NB_F32) return -1;
        float *d = nb_data(p);
        for (int64_t i = 0; i < ti.rows * ti.cols; i++) d[i] = gf_value(c, &ti, t, i);
        nb_mark_modified(p);
    }
    return 0;
}

static double batch_loss(nb_GPT *m, nb_tensor *idx, nb_tensor *targets) {
    nb_scope_begin();
    double l = nb_item(nb_gpt_loss(m, idx, targets, false, NULL));
    nb_scope_end();
    return l;
}

int main(int argc, char **argv) {
    const char *config = NULL, *fixture = NULL, *llmc = NULL, *tokfile = NULL;
    int generated = 0, threads = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--generated")) generated = 1;
        else if (a + 1 >= argc) return usage(argv[0]);
        else if (!strcmp(argv[a], "--config")) config = argv[++a];
        else if (!strcmp(argv[a], "--fixture")) fixture = argv[++a];
        else if (!strcmp(argv[a], "--llmc")) llmc = argv[++a];
        else if (!strcmp(argv[a], "--tokens")) tokfile = argv[++a];
        else if (!strcmp(argv[a], "--threads")) threads = atoi(argv[++a]);
        else return usage(argv[0]);
    }
    const gf_config *c = config ? gf_config_named(config) : NULL;
    if (!c || !fixture || (!generated && (!llmc || !tokfile))) return usage(argv[0]);
    if (threads > 0) nb_set_num_threads(threads);
    gf_fixture fx;
    if (gf_fixture_read(fixture, c->name, &fx)) return 1;
    if (fx.seed != c->seed || fx.batch != c->batch || fx.seq != c->seq) {
        fprintf(stderr, "gpt-check: %s's %s block is not of tests/gpt_files.h's config\n", fixture,
                c->name);
        return 1;
    }
    const char *src = generated ? "generated weights" : "llm.c file";
    double t0 = now();

    nb_GPTConfig cfg = {.vocab_size = c->vocab, .block_size = c->block, .n_layer = c->n_layer,
                        .n_head = c->n_head, .n_embd = c->n_embd, .dropout = 0.0, .bias = true,
                        .tie_weights = true};
    if (!generated && nb_gpt_config_of_file(llmc, &cfg)) {
        fprintf(stderr, "gpt-check: %s\n", nb_last_error());
        return 1;
    }
    nb_rng rng;
    nb_rng_seed(&rng, 1);
    nb_GPT m;
    nb_params *ps = nb_params_new();
    int rc = nb_gpt_init(&m, ps, &cfg, &rng);
    double t_init = now() - t0;
    if (rc || (generated ? set_generated(c, ps) : nb_gpt_load_llmc(&m, llmc))) {
        fprintf(stderr, "gpt-check: %s\n", generated ? "cannot set the weights" : nb_last_error());
        return 1;
    }
    int64_t B = c->batch, T = c->seq;
    nb_tensor *tokens;
    if (generated) {
        int64_t *tv = malloc((size_t)(B * T + 1) * sizeof *tv);
        for (int64_t i = 0; i <= B * T; i++) tv[i] = gf_token(c, i);
        tokens = nb_from_data(NB_I64, NB_SHAPE(B * T + 1), tv);
        free(tv);
    } else tokens = nb_load_tokens(tokfile, cfg.vocab_size);
    if (!tokens || nb_numel(tokens) < B * T + 1) {
        fprintf(stderr, "gpt-check: tokens: %s\n", tokens ? "too few" : nb_last_error());
        return 1;
    }
    nb_scope_begin(); /* the batch's views */
    nb_tensor *idx = nb_reshape(nb_narrow(tokens, 0, 0, B * T), NB_SHAPE(B, T));
    nb_tensor *targets = nb_reshape(nb_narrow(tokens, 0, 1, B * T), NB_SHAPE(B, T));
    double t_load = now() - t0 - t_init;

    /* the step, exactly as gen_gpt.py's */
    nb_optim *opt = nb_adamw(ps, fx.lr, fx.beta1, fx.beta2, fx.eps, fx.wd);
    if (!opt || nb_gpt_set_weight_decay(&m, opt, fx.wd)) {
        fprintf(stderr, "gpt-check: %s\n", nb_last_error());
        return 1;
    }
    int n = nb_params_count(ps);
    if (n != fx.n) {
        fprintf(stderr, "gpt-check: the model has %d parameters, the fixture %d\n", n, fx.n);
        return 1;
    }
    /* the initial values: the generator's, which the loaded file must hold bitwise */
    int64_t differ = 0;
    for (int t = 0; t < n; t++) {
        gf_tensor ti = gf_tensor_info(c, t);
        nb_tensor *p = nb_params_get(ps, ti.name);
        if (!p || strcmp(ti.name, fx.p[t].name) || nb_numel(p) != fx.p[t].numel ||
            nb_dtype_of(p) != NB_F32 || !nb_is_contiguous(p)) {
            fprintf(stderr, "gpt-check: parameter %s: %s\n", ti.name,
                    p ? "not the fixture's (name, size)" : nb_last_error());
            return 1;
        }
        const float *d = nb_data(p);
        for (int64_t i = 0; i < ti.rows * ti.cols; i++) {
            float want = gf_value(c, &ti, t, i);
            if (memcmp(&d[i], &want, sizeof want) && differ++ < 5)
                printf("gpt-check:   %s[%lld] is %.9g, the file holds %.9g\n", ti.name,
                       (long long)i, (double)d[i], (double)want);
        }
    }
    report(differ == 0, "%s %s: %d tensors, %lld values, bitwise the generator's (%lld differ)",
           c->name, src, n, (long long)nb_params_numel(ps), (long long)differ);
    t0 = now();
    nb_scope_begin();
    nb_tensor *loss = nb_gpt_loss(&m, idx, targets, true, NULL);
    double l0 = nb_item(loss);
    if (!loss || nb_backward(loss)) {
        fprintf(stderr, "gpt-check: %s\n", nb_last_error());
        return 1;
    }
    nb_optim_step(opt);
    nb_scope_end();
    double t_step = now() - t0;
    report(rel(l0, fx.loss_before) <= REL_TOL, "%s %s, batch %lldx%lld: loss %.7f, torch %.7f "
           "(rel %.1e)", c->name, src, (long long)B, (long long)T, l0, fx.loss_before,
           rel(l0, fx.loss_before));

    double worst_g = 0, worst_u = 0, worst_s = 0;
    const char *wg = "", *wu = "", *ws = "";
    int undecided = 0, samples = 0, grad_bad = 0, step_bad = 0;
    for (int i = 0; i < n; i++) {
        const gf_param_fx *p = &fx.p[i];
        nb_tensor *t = nb_params_get(ps, p->name), *g = nb_grad(t);
        if (!g || !nb_is_contiguous(g)) {
            printf("gpt-check:   %s has no gradient\n", p->name);
            grad_bad++, step_bad++;
            continue;
        }
        const float *after = nb_data(t), *grad = nb_data(g);
        gf_tensor ti = gf_tensor_info(c, i);
        float *before = malloc((size_t)p->numel * sizeof *before);
        for (int64_t k = 0; k < p->numel; k++) before[k] = gf_value(c, &ti, i, k);
        gf_compare r = gf_compare_param(&fx, p, before, after, grad);
        free(before);
        if (r.grad_norm_rel > worst_g) worst_g = r.grad_norm_rel, wg = p->name;
        if (r.update_norm_rel > worst_u) worst_u = r.update_norm_rel, wu = p->name;
        if (r.worst_sample > worst_s) worst_s = r.worst_sample, ws = p->name;
        undecided += r.undecided, samples += p->k;
        grad_bad += !(r.grad_norm_rel <= REL_TOL);
        int sb = !(r.update_norm_rel <= REL_TOL) || !(r.worst_sample <= 1);
        step_bad += sb;
        if (sb || !(r.grad_norm_rel <= REL_TOL)) {
            int64_t w = p->idx[r.worst_k];
            printf("gpt-check:   %s: gradient norm rel %.1e, update norm rel %.1e; [%lld] updated "
                   "%.9g, torch %.9g (gradient %.9g, torch %.9g), %.2f x tolerance\n",
                   p->name, r.grad_norm_rel, r.update_norm_rel, (long long)w, (double)after[w],
                   p->updated[r.worst_k], (double)grad[w], p->grad[r.worst_k], r.worst_sample);
        }
    }
    report(!grad_bad, "%s gradients: %d tensors, L2 norms within %.1e relative "
           "(worst %s)", c->name, n, worst_g, wg);
    report(!step_bad, "%s one AdamW step: update norms within "
           "%.1e relative (worst %s); %d sampled values within %.2f of their tolerance (worst %s), "
           "%d with an unsettled gradient sign", c->name, worst_u, wu, samples, worst_s, ws,
           undecided);
    double l1 = batch_loss(&m, idx, targets);
    report(rel(l1, fx.loss_after) <= REL_TOL, "%s loss after the step %.7f, torch %.7f (rel %.1e)",
           c->name, l1, fx.loss_after, rel(l1, fx.loss_after));
    printf("gpt-check: %s: nb_gpt_init %.1f s, load (weights and tokens) %.1f s, forward + backward "
           "+ step %.1f s, %d threads\n", c->name, t_init, t_load, t_step, nb_num_threads());
    nb_scope_end();
    nb_optim_free(opt);
    nb_free(tokens);
    nb_gpt_free(&m);
    nb_params_free(ps);
    gf_fixture_free(&fx);
    return fails ? 1 : 0;
}
