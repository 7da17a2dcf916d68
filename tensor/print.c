/* print.c: nb_print, in PyTorch's layout: nested brackets, 4 decimals,
 * the middle of long dims elided. */
#include "tensor_internal.h"

#include "bf16_internal.h"

#include <math.h>

#define EDGE 3 /* elements shown at each end of a long dim */

static void print_value(const nb_tensor *t, int64_t off) {
    const void *p = t->storage->data;
    switch (t->dtype) {
    case NB_F32: printf("%.4f", ((const float *)p)[off]); break;
    case NB_F64: printf("%.4f", ((const double *)p)[off]); break;
    case NB_I64: printf("%lld", (long long)((const int64_t *)p)[off]); break;
    case NB_BF16: printf("%.4f", (double)nbi_bf16_to_f32(((const uint16_t *)p)[off])); break;
    case NB_BOOL: printf("%s", ((const bool *)p)[off] ? "True" : "False"); break;
    }
}

static void print_dim(const nb_tensor *t, int d, int64_t off, bool elide) {
    if (d == t->ndim) {
        print_value(t, off);
        return;
    }
    printf("[");
    int64_t n = t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        if (elide && n > 2 * EDGE && i == EDGE) {
            printf("...");
            i = n - EDGE - 1;
            printf(d == t->ndim - 1 ? ", " : ",\n%*s", d == t->ndim - 1 ? 0 : 8 + d, "");
            continue;
        }
        print_dim(t, d + 1, off + i * t->strides[d], elide);
        if (i + 1 < n) printf(d == t->ndim - 1 ? ", " : ",\n%*s", d == t->ndim - 1 ? 0 : 8 + d, "");
    }
    printf("]");
}

void nb_print(const nb_tensor *t) {
    if (!t) {
        printf("tensor(NULL)\n");
        return;
    }
    if (!nbi_arg("nb_print", t, 0)) {
        printf("tensor(freed)\n");
        return;
    }
    printf("tensor(");
    /* elided when long, and when empty: (INT64_MAX, 0) has that many rows */
    print_dim(t, 0, t->offset, t->numel > 1000 || t->numel == 0);
    printf(", shape=%s, dtype=%s%s)\n", NBI_SHAPE(t), nb_dtype_name(t->dtype),
           t->requires_grad ? ", requires_grad" : "");
}
