/*
 * Activation files: per-layer Q, K and V captured from a real model (tools/capture_activations.py)
 * in one safetensors file, read here so that the C tools run on them. docs/activations.md is the
 * format; in short:
 *   - 8 bytes: N, the JSON header's length, unsigned little-endian; N bytes of JSON (UTF-8, may
 *     end in spaces); then the tensors' raw little-endian bytes. A tensor's "data_offsets"
 *     [begin, end) count from the first byte after the header.
 *   - tensors "layers.<L>.q" (B, Hq, Sq, D), "layers.<L>.k" and "layers.<L>.v" (B, Hkv, Skv, D),
 *     BHSD, dtype BF16 (F32 is accepted and rounded to BF16 on reading); a rank-3 tensor
 *     (H, S, D) is batch 1. Other tensors are ignored. Q and K are after RoPE.
 *   - "__metadata__" (string -> string): "format" = "sparseattn.activations", "heads_q",
 *     "heads_kv", "head_dim", "scale", "causal", "sliding_window" (0: none), "rope_theta",
 *     "model", ...; per layer "layers.<L>.<key>" overrides the file-wide "<key>".
 * Nothing here restricts head_dim: callers check the shape (sa_shape_check) before computing.
 */
#ifndef SA_ACTIVATIONS_H
#define SA_ACTIVATIONS_H

#include <stddef.h>
#include <stdint.h>

#include "sparseattn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sa_act_file sa_act_file;

/* One captured layer. */
typedef struct sa_act_layer {
    int layer;          /* the model's layer index L */
    sa_shape shape;     /* from the tensors: batch, heads, lengths, head_dim */
    double scale;       /* softmax scale ("scale"; default 1/sqrt(head_dim)) */
    int causal;         /* "causal" (default 0) */
    int sliding_window; /* "sliding_window": a query sees the last W keys; 0 = no window */
    double rope_theta;  /* "rope_theta" (0 when absent) */
} sa_act_layer;

/* Opens and checks a file: the header, every layer's three tensors (ranks, dtypes, matching
 * batch, heads, lengths and head_dim, data inside the file, byte counts), the metadata's numbers.
 * On failure *out is NULL and, when err is not NULL, err (errlen bytes) names the problem.
 * SA_OK, SA_ERR_NULL, SA_ERR_ARG (unreadable or malformed file; err says which), SA_ERR_NOMEM. */
SA_API int sa_act_open(const char *path, sa_act_file **out, char *err, size_t errlen);
SA_API void sa_act_close(sa_act_file *f); /* NULL is a no-op */

/* Layers in increasing layer index; -1 for f NULL. */
SA_API int sa_act_layer_count(const sa_act_file *f);
/* Layer i (0 <= i < sa_act_layer_count), or the layer whose model index is `layer` (-1 if none). */
SA_API int sa_act_layer_info(const sa_act_file *f, int i, sa_act_layer *info);
SA_API int sa_act_find_layer(const sa_act_file *f, int layer);

/* Reads layer i's tensors as BF16 BHSD: q holds sa_q_elems-many values of its shape, k and v
 * sa_kv_elems-many (computed without sa_shape_check's head_dim rule). Any of q, k, v may be NULL
 * (not read); all NULL is SA_ERR_NULL. SA_ERR_ARG for i out of range or a failed read. */
SA_API int sa_act_read(const sa_act_file *f, int i, uint16_t *q, uint16_t *k, uint16_t *v);

/* A metadata value, or NULL when absent. sa_act_layer_meta looks up "layers.<L>.<key>" first,
 * then "<key>". Valid until sa_act_close. */
SA_API const char *sa_act_meta(const sa_act_file *f, const char *key);
SA_API const char *sa_act_layer_meta(const sa_act_file *f, int i, const char *key);
/* The n-th metadata key (0 <= n < count), for listing; NULL past the end. */
SA_API int sa_act_meta_count(const sa_act_file *f);
SA_API const char *sa_act_meta_key(const sa_act_file *f, int n);

#ifdef __cplusplus
}
#endif
#endif
