/* safetensors_internal.h: the safetensors header, written and parsed by
 * nn/safetensors.c for nb_save and nb_load (nn/checkpoint.c). */
#ifndef NABLA_SAFETENSORS_INTERNAL_H
#define NABLA_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn_internal.h"

#define NN_ST_MAX_HEADER (100u << 20) /* bytes of JSON, as the reference implementation */

/* One tensor, of a registry or of a file. */
typedef struct {
    const char *name; /* the registry's, or the header's own copy */
    nb_tensor *t;     /* registry side */
    nn_values check;  /* registry side: what its loaded values must be */
    int file;         /* registry side: its entry in the file's header, once matched */
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    uint64_t begin, end; /* file side: data_offsets */
} nn_st_item;

/* A parsed header: its tensors in file order (names owned), and an index of
 * the names (values: positions in v). */
typedef struct {
    nn_st_item *v;
    int n, cap;
    char **names;
    nn_index index;
} nn_st_header;

size_t nn_st_dtype_size(nb_dtype d);    /* 4, 8, 8, 1 */
const char *nn_st_dtype_tag(nb_dtype d); /* "F32", "F64", "I64", "BOOL" */
bool nn_st_little_endian(void);
/* n elements of size bytes, each byte-reversed on a big-endian host */
void nn_st_copy_le(void *dst, const void *src, size_t n, size_t size);

/* The header for v[0..n) laid out one after another from offset 0, padded to
 * a multiple of 8: malloc'ed, length in *len; NULL when out of memory. */
char *nn_st_header_build(const nn_st_item *v, int n, size_t *len);
/* Parses and checks len bytes of header text against a data section of
 * data_len bytes; 0, or -1 with the reason in msg. Free h either way. */
int nn_st_header_parse(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                       char *msg, size_t cap);
void nn_st_header_free(nn_st_header *h);
/* The position in h->v of the tensor called name, or -1. */
int nn_st_header_find(const nn_st_header *h, const char *name);

#endif
