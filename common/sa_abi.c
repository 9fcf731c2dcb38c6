/* The ABI check for foreign callers (python/, or any binding that mirrors the public structs):
 * sizeof and offsetof of every public struct, looked up by name. A binding compares its mirror
 * against these at load time, so a library and a binding from different versions fail loudly
 * instead of passing misplaced pointers. A new field of a public struct gets its F() line here. */
#include <stddef.h>
#include <string.h>

#include "sa_activations.h"
#include "sparseattn.h"

typedef struct abi_field {
    const char *type;
    const char *field; /* NULL: the row gives the struct's size */
    size_t value;
} abi_field;

#define S(T) {#T, NULL, sizeof(T)}
#define F(T, f) {#T, #f, offsetof(T, f)}

static const abi_field table[] = {
    S(sa_shape),
    F(sa_shape, batch), F(sa_shape, heads_q), F(sa_shape, heads_kv), F(sa_shape, len_q),
    F(sa_shape, len_kv), F(sa_shape, head_dim),

    S(sa_tile_lists),
    F(sa_tile_lists, indices), F(sa_tile_lists, counts), F(sa_tile_lists, list_heads),
    F(sa_tile_lists, max_blocks),

    S(sa_query_lists),
    F(sa_query_lists, indices), F(sa_query_lists, counts), F(sa_query_lists, max_blocks),

    S(sa_rng),
    F(sa_rng, s),

    S(sa_outputs),
    F(sa_outputs, o), F(sa_outputs, o_f32), F(sa_outputs, lse),

    S(sa_attn_opts),
    F(sa_attn_opts, allow_empty_rows), F(sa_attn_opts, validate), F(sa_attn_opts, causal),
    F(sa_attn_opts, allow_future_blocks),

    S(sa_gpu_attn),
    F(sa_gpu_attn, shape), F(sa_gpu_attn, q), F(sa_gpu_attn, k), F(sa_gpu_attn, v),
    F(sa_gpu_attn, lists), F(sa_gpu_attn, o), F(sa_gpu_attn, lse), F(sa_gpu_attn, validate),
    F(sa_gpu_attn, allow_empty_rows), F(sa_gpu_attn, stream), F(sa_gpu_attn, verdict),
    F(sa_gpu_attn, causal), F(sa_gpu_attn, allow_future_blocks), F(sa_gpu_attn, row_masks),

    S(sa_gpu_attn_bwd),
    F(sa_gpu_attn_bwd, shape), F(sa_gpu_attn_bwd, q), F(sa_gpu_attn_bwd, k),
    F(sa_gpu_attn_bwd, v), F(sa_gpu_attn_bwd, o), F(sa_gpu_attn_bwd, lse),
    F(sa_gpu_attn_bwd, d_o), F(sa_gpu_attn_bwd, lists), F(sa_gpu_attn_bwd, dq),
    F(sa_gpu_attn_bwd, dk), F(sa_gpu_attn_bwd, dv), F(sa_gpu_attn_bwd, validate),
    F(sa_gpu_attn_bwd, allow_empty_rows), F(sa_gpu_attn_bwd, causal),
    F(sa_gpu_attn_bwd, allow_future_blocks), F(sa_gpu_attn_bwd, workspace),
    F(sa_gpu_attn_bwd, workspace_bytes), F(sa_gpu_attn_bwd, stream), F(sa_gpu_attn_bwd, dq_pass),
    F(sa_gpu_attn_bwd, verdict),

    S(sa_stage),
    F(sa_stage, id), F(sa_stage, name), F(sa_stage, summary), F(sa_stage, roles),
    F(sa_stage, check), F(sa_stage, launch),

    S(sa_select_params),
    F(sa_select_params, k), F(sa_select_params, keep_diagonal), F(sa_select_params, keep_sink),
    F(sa_select_params, q_index), F(sa_select_params, k_index), F(sa_select_params, index_dim),
    F(sa_select_params, stream), F(sa_select_params, seed), F(sa_select_params, causal),
    F(sa_select_params, index_heads), F(sa_select_params, keep_local),
    F(sa_select_params, verdict), F(sa_select_params, head_lists), F(sa_select_params, pool_cap),

    S(sa_selector),
    F(sa_selector, name), F(sa_selector, description), F(sa_selector, per_query),
    F(sa_selector, cpu), F(sa_selector, cuda), F(sa_selector, head_lists),
    F(sa_selector, cuda_head_lists), F(sa_selector, ignores_index),

    S(sa_nvfp4),
    F(sa_nvfp4, values), F(sa_nvfp4, scales), F(sa_nvfp4, tensor_scale), F(sa_nvfp4, n),

    S(sa_workload),
    F(sa_workload, name), F(sa_workload, description), F(sa_workload, knob),
    F(sa_workload, default_strength),

    S(sa_kv_task),
    F(sa_kv_task, bucket), F(sa_kv_task, begin), F(sa_kv_task, count), F(sa_kv_task, chunk),

    S(sa_kv_params),
    F(sa_kv_params, shape), F(sa_kv_params, q), F(sa_kv_params, k), F(sa_kv_params, v),
    F(sa_kv_params, lists), F(sa_kv_params, o), F(sa_kv_params, o_f32), F(sa_kv_params, lse),
    F(sa_kv_params, partial_format), F(sa_kv_params, validate),
    F(sa_kv_params, allow_empty_rows), F(sa_kv_params, workspace),
    F(sa_kv_params, workspace_bytes), F(sa_kv_params, stream), F(sa_kv_params, causal),
    F(sa_kv_params, allow_future_blocks), F(sa_kv_params, attend), F(sa_kv_params, schedule),
    F(sa_kv_params, hybrid_share),

    S(sa_kv_index_view),
    F(sa_kv_index_view, offsets), F(sa_kv_index_view, entries), F(sa_kv_index_view, tasks),
    F(sa_kv_index_view, info),

    S(sa_act_layer),
    F(sa_act_layer, layer), F(sa_act_layer, shape), F(sa_act_layer, scale),
    F(sa_act_layer, causal), F(sa_act_layer, sliding_window), F(sa_act_layer, rope_theta),
};

#undef S
#undef F

static const abi_field *find(const char *type, const char *field)
{
    if (!type)
        return NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const abi_field *e = &table[i];
        if (strcmp(e->type, type))
            continue;
        if (!field ? !e->field : e->field && !strcmp(e->field, field))
            return e;
    }
    return NULL;
}

size_t sa_abi_sizeof(const char *struct_name)
{
    const abi_field *e = find(struct_name, NULL);
    return e ? e->value : 0;
}

size_t sa_abi_offsetof(const char *struct_name, const char *field)
{
    const abi_field *e = field ? find(struct_name, field) : NULL;
    return e ? e->value : (size_t)-1;
}
