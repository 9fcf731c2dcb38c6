#include "sparseattn.h"

const char *sa_strerror(int code)
{
    switch (code) {
    case SA_OK: return "success";
    case SA_ERR_NULL: return "a required pointer argument is NULL";
    case SA_ERR_SHAPE: return "bad shape: every size must be positive and the tensors must fit in memory";
    case SA_ERR_GQA: return "bad shape: heads_q must be a multiple of heads_kv";
    case SA_ERR_HEAD_DIM: return "bad shape: unsupported head_dim (the reference supports 64, 128 and 256)";
    case SA_ERR_INDEX: return "block list: a block index lies outside [0, kv_blocks)";
    case SA_ERR_DUPLICATE: return "block list: the same block appears twice in one row";
    case SA_ERR_COUNT: return "block list: a row count lies outside [0, max_blocks]";
    case SA_ERR_EMPTY_ROW: return "block list: a row has count 0 but empty rows are not allowed";
    case SA_ERR_LIST_HEADS: return "block list: list_heads must equal heads_kv or heads_q";
    case SA_ERR_MAX_BLOCKS:
        return "block list: max_blocks must be positive, and the list array within the element limit";
    case SA_ERR_ARG: return "an argument is out of range (for example top-k larger than the number of blocks)";
    case SA_ERR_NOMEM: return "out of memory (host or device)";
    case SA_ERR_UNSUPPORTED: return "this kernel does not support the shape (see the stage's assumptions)";
    case SA_ERR_NO_DEVICE: return "no usable CUDA device (an sm_90 GPU is required)";
    case SA_ERR_CUDA: return "a CUDA call or kernel launch failed";
    case SA_ERR_NOT_BUILT: return "the library was built without CUDA";
    case SA_ERR_UNKNOWN: return "no entry of that name in the registry";
    case SA_ERR_FUTURE_BLOCK:
        return "causal attention: a listed block lies wholly after its row's last visible key";
    default: return "unknown error code";
    }
}
