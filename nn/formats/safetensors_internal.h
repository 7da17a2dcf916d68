/* safetensors_internal.h: the safetensors header, written and parsed by
 * nn/formats/safetensors.c for nb_save and nb_load (nn/formats/checkpoint.c). */
#ifndef NABLA_SAFETENSORS_INTERNAL_H
#define NABLA_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../nn_internal.h"

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
    /* file side, parsed by nn_st_header_parse_any only: a dtype nabla has no
     * nb_dtype for (F16, BF16, U8, ...): its tag, and dtype NN_ST_FOREIGN */
    const char *foreign;
} nn_st_item;

/* The dtype of an item whose dtype is foreign (never a tensor's). */
#define NN_ST_FOREIGN ((nb_dtype)0x7f)

/* A parsed header: its tensors in file order (names owned), an index of
 * the names (values: positions in v), and __metadata__'s n_meta pairs
 * (meta[2i] the key, meta[2i+1] its value; owned). */
typedef struct {
    nn_st_item *v;
    int n, cap;
    char **names;
    nn_index index;
    char **meta;
    int n_meta;
} nn_st_header;

size_t nn_st_dtype_size(nb_dtype d);    /* 4, 8, 8, 1 */
const char *nn_st_dtype_tag(nb_dtype d); /* "F32", "F64", "I64", "BOOL" */

/* The header for v[0..n) laid out one after another from offset 0, padded to
 * a multiple of 8: malloc'ed, length in *len; NULL when out of memory. */
char *nn_st_header_build(const nn_st_item *v, int n, size_t *len);
/* The same with n_meta more pairs (meta[2i] the key, meta[2i+1] the value)
 * in __metadata__, after "format": "pt". */
char *nn_st_header_build_meta(const nn_st_item *v, int n, const char *const *meta, int n_meta,
                              size_t *len);
/* Parses and checks len bytes of header text against a data section of
 * data_len bytes; 0, or -1 with the reason in msg. Free h either way. */
int nn_st_header_parse(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                       char *msg, size_t cap);
/* The same, but tensors of the safetensors dtypes nabla has no nb_dtype for
 * (F16, BF16, I8, U8, I16, U16, I32, U32, U64, F8_E4M3, F8_E5M2) are
 * accepted too, as items with dtype NN_ST_FOREIGN and their tag in foreign
 * (for readers that skip some tensors, e.g. Hugging Face's attention-mask
 * buffers). nb_load does not use it. */
int nn_st_header_parse_any(const char *text, size_t len, uint64_t data_len, nn_st_header *h,
                           char *msg, size_t cap);
void nn_st_header_free(nn_st_header *h);
/* The value of __metadata__'s key, or NULL. */
const char *nn_st_header_meta(const nn_st_header *h, const char *key);
/* The position in h->v of the tensor called name, or -1. */
int nn_st_header_find(const nn_st_header *h, const char *name);

#endif
