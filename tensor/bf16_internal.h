/* bf16_internal.h: bfloat16 <-> float, one element at a time, bit for bit
 * as PyTorch's CPU .to(torch.bfloat16) (kernels with vector conversions must
 * give the same bits). A bf16 is the top 16 bits of an IEEE float: 1 sign, 8 exponent and
 * 7 mantissa bits. */
#ifndef NABLA_BF16_INTERNAL_H
#define NABLA_BF16_INTERNAL_H

#include <stdint.h>
#include <string.h>

/* Round to nearest, ties to even; overflow rounds to infinity; every NaN
 * becomes 0xffff, the NaN PyTorch's vectorized conversion writes (its scalar
 * one, used only for the tail of an f64 tensor, writes 0x7fc0). */
static inline uint16_t nbi_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Exact. */
static inline float nbi_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* From double, as PyTorch: through float first (two roundings). */
static inline uint16_t nbi_bf16_from_f64(double d) { return nbi_bf16_from_f32((float)d); }

#endif
