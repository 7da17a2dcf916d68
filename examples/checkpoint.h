/* checkpoint.h: the checkpoint registry of a training run, shared by the
 * examples (included by copy_task.c and gpt.c). One nb_params holds the
 * model's parameters under their own names, the optimizer's state under
 * "optim." and the loop's own values under "trainer.": n i64 buffers named
 * names[i], 0-d for the first n_scalars and (2) after them (a random
 * stream's seed and offset). nb_save / nb_load of it resume a run exactly. */
#ifndef NABLA_EXAMPLES_CHECKPOINT_H
#define NABLA_EXAMPLES_CHECKPOINT_H

#include "nabla.h"

/* 0, or -1 with nabla's message; *trainer and *ckpt are the caller's to
 * nb_params_free (ckpt first: it shares trainer's tensors). */
static int checkpoint_registry_make(nb_params *model, nb_optim *opt, const char *const *names,
                                    int n, int n_scalars, nb_params **trainer, nb_params **ckpt) {
    *trainer = nb_params_new();
    *ckpt = nb_params_new();
    if (!*trainer || !*ckpt) return -1;
    nb_scope_begin();
    for (int i = 0; i < n; i++) {
        nb_tensor *t = i < n_scalars ? nb_zeros(NB_I64, 0, NULL) : nb_zeros(NB_I64, NB_SHAPE(2));
        if (!nb_params_add_buffer(*trainer, names[i], t)) break;
    }
    nb_scope_end();
    if (nb_params_buffer_count(*trainer) != n || nb_params_add_all(*ckpt, "", model) != 0 ||
        nb_params_add_all(*ckpt, "optim.", nb_optim_state(opt)) != 0 ||
        nb_params_add_all(*ckpt, "trainer.", *trainer) != 0)
        return -1;
    return 0;
}

/* The values of trainer buffer i. */
static inline int64_t *checkpoint_value(nb_params *trainer, int i) {
    return nb_data(nb_params_buffer_at(trainer, i, NULL));
}

#endif
