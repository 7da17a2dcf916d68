/* byteorder_internal.h: the byte order of nabla's files. Every file nabla
 * writes or reads is little-endian on disk whatever the host (safetensors,
 * nb_save's checkpoints, llm.c's checkpoints, token files and tokenizer);
 * IDX files are big-endian, as their format says. Values go through these
 * loads and stores (bytes assembled with shifts: compilers make them one
 * load or store on a host of the same order, a byte-reversing one on the
 * other), and bulk data is read or written as it is in memory, then put in
 * order by nn_swap_le (nothing on a little-endian host). */
#ifndef NABLA_NN_BYTEORDER_INTERNAL_H
#define NABLA_NN_BYTEORDER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Swapping an element's bytes converts between the two orders only when
 * integers and floats are stored in one order, bytes reversed or not
 * (PDP-endian hosts and ARM's old mixed-endian doubles are neither). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__ && \
    __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__
#error "nabla's files: this host is neither little- nor big-endian"
#endif
#if defined(__FLOAT_WORD_ORDER__) && defined(__BYTE_ORDER__) && \
    __FLOAT_WORD_ORDER__ != __BYTE_ORDER__
#error "nabla's files: this host stores floats in another byte order than integers"
#endif

static inline bool nn_host_le(void) {
#if defined(__BYTE_ORDER__)
    return __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
#endif
}

/* ------------------------------------------------ one value, little-endian */
static inline uint16_t nn_ld_le16(const void *p) {
    const unsigned char *b = p;
    return (uint16_t)(b[0] | b[1] << 8);
}
static inline uint32_t nn_ld_le32(const void *p) {
    const unsigned char *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t nn_ld_le64(const void *p) {
    const unsigned char *b = p;
    return (uint64_t)nn_ld_le32(b) | (uint64_t)nn_ld_le32(b + 4) << 32;
}
static inline void nn_st_le16(void *p, uint16_t v) {
    unsigned char *b = p;
    b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8);
}
static inline void nn_st_le32(void *p, uint32_t v) { /* written out: one store */
    unsigned char *b = p;
    b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8);
    b[2] = (unsigned char)(v >> 16), b[3] = (unsigned char)(v >> 24);
}
static inline void nn_st_le64(void *p, uint64_t v) {
    unsigned char *b = p;
    nn_st_le32(b, (uint32_t)v);
    nn_st_le32(b + 4, (uint32_t)(v >> 32));
}
static inline float nn_ld_le_f32(const void *p) {
    uint32_t u = nn_ld_le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline double nn_ld_le_f64(const void *p) {
    uint64_t u = nn_ld_le64(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
static inline void nn_st_le_f32(void *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    nn_st_le32(p, u);
}
static inline void nn_st_le_f64(void *p, double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    nn_st_le64(p, u);
}
/* bf16: its 16 bits (the high half of an f32), as nabla stores them */
static inline uint16_t nn_ld_le_bf16(const void *p) { return nn_ld_le16(p); }
static inline void nn_st_le_bf16(void *p, uint16_t bits) { nn_st_le16(p, bits); }

/* --------------------------------------------------- one value, big-endian */
static inline uint16_t nn_ld_be16(const void *p) {
    const unsigned char *b = p;
    return (uint16_t)(b[0] << 8 | b[1]);
}
static inline uint32_t nn_ld_be32(const void *p) {
    const unsigned char *b = p;
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}
static inline uint64_t nn_ld_be64(const void *p) {
    const unsigned char *b = p;
    return (uint64_t)nn_ld_be32(b) << 32 | (uint64_t)nn_ld_be32(b + 4);
}

/* ------------------------------------------------------------------ arrays */
/* Reverses the bytes of each of n elements of `size` bytes at p, in place. */
static inline void nn_swap_bytes(void *p, size_t n, size_t size) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++, c += size)
        for (size_t b = 0; b < size / 2; b++) {
            unsigned char t = c[b];
            c[b] = c[size - 1 - b];
            c[size - 1 - b] = t;
        }
}

/* n elements of `size` bytes (1, 2, 4 or 8) at p, between file order
 * (little-endian) and memory order, in place: each element's bytes reversed
 * on a big-endian host, nothing on a little-endian one. */
static inline void nn_swap_le(void *p, size_t n, size_t size) {
    if (!nn_host_le() && size > 1) nn_swap_bytes(p, n, size);
}

/* n elements of `size` bytes from src to dst (not overlapping), converted
 * between file order (little-endian) and memory order: a memcpy on a
 * little-endian host. */
static inline void nn_copy_le(void *dst, const void *src, size_t n, size_t size) {
    memcpy(dst, src, n * size);
    nn_swap_le(dst, n, size);
}

#endif
