/* conv.c: the modules torch.nn.Conv1d and Conv2d: their parameters, torch's
 * init, and nb_conv1d / nb_conv2d (ops/conv.c) with them. */
#include <math.h>

#include "nn_internal.h"

/* torch's _ConvNd.reset_parameters: kaiming_uniform(a = sqrt 5) gives the
 * weight U(+-1/sqrt(fan_in)), fan_in = in/groups * the kernel's size, and
 * the bias the same bound. Registers "<name>.weight" (out, in/groups,
 * kernel...) then "<name>.bias". */
static int conv_params(const char *fn, nb_params *ps, const char *name, int64_t in, int64_t out,
                       int64_t groups, int nk, const int64_t *kernel, bool bias, nb_rng *rng,
                       nb_tensor **weight, nb_tensor **b) {
    int64_t shape[4] = {out, in / groups}, fan_in = in / groups;
    for (int i = 0; i < nk; i++) {
        shape[2 + i] = kernel[i];
        if (fan_in > INT64_MAX / kernel[i]) {
            if (nk == 1)
                return (nn_error("%s: kernel_size %lld x in/groups %lld weights per output "
                                 "channel pass INT64_MAX",
                                 fn, (long long)kernel[0], (long long)(in / groups)), -1);
            return (nn_error("%s: kernel_size (%lld, %lld) x in/groups %lld weights per output "
                             "channel pass INT64_MAX",
                             fn, (long long)kernel[0], (long long)kernel[1],
                             (long long)(in / groups)), -1);
        }
        fan_in *= kernel[i];
    }
    char buf[512];
    double bound = 1.0 / sqrt((double)fan_in);
    *weight = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "weight"), 2 + nk, shape,
                               bound, rng);
    if (!*weight) return -1;
    if (bias && !(*b = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "bias"), 1, &out,
                                        bound, rng)))
        return -1;
    return 0;
}

/* The sizes torch checks when a Conv module is made: positive channels and
 * kernel, groups dividing both channel counts, stride and dilation >= 1 (0
 * is an error, as in nb_conv1d / nb_conv2d), padding >= 0 or "same" (then
 * stride 1), and a dilated kernel d (k - 1) + 1 that fits int64 (nb_conv1d
 * / nb_conv2d would refuse every input). nd dims; padding[0] may be
 * NB_PADDING_SAME, which then stands for every dim (padding[1] is not read);
 * in padding[1] alone it is an error, as nb_conv2d says. */
static bool conv_sizes_ok(const char *fn, int64_t in, int64_t out, int64_t groups, int nd,
                          const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                          const int64_t *dilation) {
    if (in <= 0 || out <= 0)
        return nn_error("%s: channels must be positive, got in %lld, out %lld", fn, (long long)in,
                        (long long)out), false;
    if (groups <= 0 || in % groups || out % groups)
        return nn_error("%s: groups %lld must be positive and divide in %lld and out %lld", fn,
                        (long long)groups, (long long)in, (long long)out), false;
    bool same = padding[0] == NB_PADDING_SAME;
    if (nd == 2 && !same && padding[1] == NB_PADDING_SAME)
        return nn_error("%s: padding[1] is NB_PADDING_SAME but padding[0] is %lld: \"same\" "
                        "pads both dims and is set by padding[0] alone",
                        fn, (long long)padding[0]), false;
    for (int i = 0; i < nd; i++) {
        const char *dim = nd == 1 ? "" : i == 0 ? " for h" : " for w";
        if (kernel[i] <= 0)
            return nn_error("%s: kernel_size must be positive, got %lld%s", fn,
                            (long long)kernel[i], dim), false;
        if (stride[i] <= 0)
            return nn_error("%s: stride must be positive, got %lld%s", fn, (long long)stride[i],
                            dim), false;
        if (dilation[i] <= 0)
            return nn_error("%s: dilation must be positive, got %lld%s", fn,
                            (long long)dilation[i], dim), false;
        if (!same && padding[i] < 0)
            return nn_error("%s: padding must be >= 0 or NB_PADDING_SAME, got %lld%s", fn,
                            (long long)padding[i], dim), false;
        int64_t span;
        if (__builtin_mul_overflow(dilation[i], kernel[i] - 1, &span) ||
            __builtin_add_overflow(span, 1, &span))
            return nn_error("%s: dilation %lld makes the dilated kernel size overflow int64 "
                            "(kernel size %lld)%s",
                            fn, (long long)dilation[i], (long long)kernel[i], dim), false;
        if (same && stride[i] != 1)
            return nn_error("%s: padding \"same\" needs stride 1, got %lld%s (as torch)", fn,
                            (long long)stride[i], dim), false;
    }
    return true;
}

/* ------------------------------------------------------------- Conv2d */
static int conv2d_init_body(nb_Conv2d *m, nb_params *ps, const char *name, int64_t in,
                            int64_t out, const int64_t kernel_size[2], const int64_t stride[2],
                            const int64_t padding[2], const int64_t dilation[2], int64_t groups,
                            bool bias, nb_rng *rng) {
    const char *fn = "nb_conv2d_init";
    if (!m || !ps) return (nn_error("%s: module or registry is NULL", fn), -1);
    if (!kernel_size) return (nn_error("%s: kernel_size is NULL", fn), -1);
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    bool same = padding && padding[0] == NB_PADDING_SAME;
    const int64_t same2[2] = {NB_PADDING_SAME, NB_PADDING_SAME};
    const int64_t *st = stride ? stride : one, *di = dilation ? dilation : one;
    const int64_t *pa = same ? same2 : padding ? padding : zero;
    if (!conv_sizes_ok(fn, in, out, groups, 2, kernel_size, st, pa, di)) return -1;
    *m = (nb_Conv2d){.in_channels = in, .out_channels = out, .groups = groups,
                     .kernel_size = {kernel_size[0], kernel_size[1]}, .stride = {st[0], st[1]},
                     .padding = {pa[0], pa[1]}, .dilation = {di[0], di[1]}};
    return conv_params(fn, ps, name, in, out, groups, 2, kernel_size, bias, rng, &m->weight,
                       &m->bias);
}

int nb_conv2d_init(nb_Conv2d *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                   const int64_t kernel_size[2], const int64_t stride[2],
                   const int64_t padding[2], const int64_t dilation[2], int64_t groups,
                   bool bias, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_conv2d_init", conv2d_init_body(m, ps, name, in, out, kernel_size,
                                                          stride, padding, dilation, groups,
                                                          bias, rng));
}

static nb_tensor *conv2d_forward_body(const nb_Conv2d *m, nb_tensor *x) {
    const char *fn = "nb_conv2d_forward";
    if (!m) return nn_error("%s: module is NULL", fn);
    if (!m->weight || m->groups <= 0)
        return nn_error("%s: module is not initialized (use nb_conv2d_init)", fn);
    if (!nn_input(fn, x, 0)) return NULL;
    return nb_conv2d(x, m->weight, m->bias, m->stride, m->padding, m->dilation, m->groups);
}

nb_tensor *nb_conv2d_forward(const nb_Conv2d *m, nb_tensor *x) {
    nn_enter();
    return nn_leave("nb_conv2d_forward", conv2d_forward_body(m, x));
}

/* ------------------------------------------------------------- Conv1d */
static int conv1d_init_body(nb_Conv1d *m, nb_params *ps, const char *name, int64_t in,
                            int64_t out, int64_t kernel_size, int64_t stride, int64_t padding,
                            int64_t dilation, int64_t groups, bool bias, nb_rng *rng) {
    const char *fn = "nb_conv1d_init";
    if (!m || !ps) return (nn_error("%s: module or registry is NULL", fn), -1);
    if (!conv_sizes_ok(fn, in, out, groups, 1, &kernel_size, &stride, &padding, &dilation))
        return -1;
    *m = (nb_Conv1d){.in_channels = in, .out_channels = out, .kernel_size = kernel_size,
                     .stride = stride, .padding = padding, .dilation = dilation,
                     .groups = groups};
    return conv_params(fn, ps, name, in, out, groups, 1, &kernel_size, bias, rng, &m->weight,
                       &m->bias);
}

int nb_conv1d_init(nb_Conv1d *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                   int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation,
                   int64_t groups, bool bias, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_conv1d_init", conv1d_init_body(m, ps, name, in, out, kernel_size,
                                                          stride, padding, dilation, groups,
                                                          bias, rng));
}

static nb_tensor *conv1d_forward_body(const nb_Conv1d *m, nb_tensor *x) {
    const char *fn = "nb_conv1d_forward";
    if (!m) return nn_error("%s: module is NULL", fn);
    if (!m->weight || m->groups <= 0)
        return nn_error("%s: module is not initialized (use nb_conv1d_init)", fn);
    if (!nn_input(fn, x, 0)) return NULL;
    return nb_conv1d(x, m->weight, m->bias, m->stride, m->padding, m->dilation, m->groups);
}

nb_tensor *nb_conv1d_forward(const nb_Conv1d *m, nb_tensor *x) {
    nn_enter();
    return nn_leave("nb_conv1d_forward", conv1d_forward_body(m, x));
}
