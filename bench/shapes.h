/* The benchmark shapes and tolerances, in one place: the C benches (tools/bench_*.c) include this
 * file and bench/peers.py reads its #define lines, so the two rooms measure the same work.
 * Keep each value a plain number or a brace list of numbers (peers.py parses them). */
#pragma once

/* The original study's block-sparse shape: B 2, 16 query heads on 1 KV head, D 128, len_q 4096,
 * 16 blocks of 128 per Q tile, at three KV lengths. */
#define SA_BENCH_SPARSE_B 2
#define SA_BENCH_SPARSE_HQ 16
#define SA_BENCH_SPARSE_HKV 1
#define SA_BENCH_SPARSE_SQ 4096
#define SA_BENCH_SPARSE_D 128
#define SA_BENCH_SPARSE_K 16
#define SA_BENCH_SPARSE_LEN_KV {4096, 8192, 16384}

/* Dense attention, (B, H, S, D) with len_q = len_kv = S: the same FLOPs at three lengths. */
#define SA_BENCH_DENSE_SHAPES {{8, 16, 4096, 128}, {4, 16, 8192, 128}, {2, 16, 16384, 128}}

/* Output checks of a timed kernel: relative L2 of O (BF16) and absolute LSE (natural log). */
#define SA_BENCH_REL_L2_TOL 1e-2
#define SA_BENCH_LSE_TOL 1e-2
/* ... and the largest absolute error of O against an exact reference (bench longctx, as the GPU
 * tests): max |O - ref| <= SA_BENCH_MAX_ABS_TOL * max |ref| + SA_BENCH_MAX_ABS_FLOOR. */
#define SA_BENCH_MAX_ABS_TOL 3e-2
#define SA_BENCH_MAX_ABS_FLOOR 1e-3
