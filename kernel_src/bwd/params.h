// The contract between the backward kernels and the launcher.
//
// Plain data only, as fwd_params.h: this header compiles in device code (nvcc) and in the
// host-only launcher (g++). A backward cubin carries three entries that run in this order on
// one stream: preprocess (dPsum = rowsum(dO * O), the LSE in base 2, the dQ accumulator
// zeroed), the main kernel (dK and dV per key tile, dQ accumulated in fp32 with atomics) and
// postprocess (dQ scaled and converted to the input dtype).
#pragma once

#include <stdint.h>

namespace cute_autotune {

// Bump whenever BwdParams or the backward entries' grids change; the launcher refuses a cubin
// whose LaunchInfo carries another number.
constexpr int kBwdAbiVersion = 3;  // 2: dq_semaphore; 3: head-dim slices

// The fp32 workspaces hold Lq rounded up to this many rows per (batch, head), so the main
// kernel reads and accumulates whole query tiles without bounds checks (every block_m of the
// space divides it): the rows past Lq hold LSE +inf and dPsum 0, which make P and dS of
// those rows exactly 0.
constexpr int kBwdSeqlenRound = 128;

// Threads per CTA of the preprocess and postprocess entries.
constexpr int kBwdAuxThreads = 128;

struct BwdParams {
  const void* q;     // [B, Hq, Lq, D] through the strides below
  const void* k;     // [B, Hkv, Lk, D]
  const void* v;     // [B, Hkv, Lk, D]
  const void* o;     // [B, Hq, Lq, D]: the forward's output
  const void* dout;  // [B, Hq, Lq, D]: the gradient of the loss with respect to o
  void* dq;          // [B, Hq, Lq, D]
  void* dk;          // [B, Hkv, Lk, D]: summed over the query heads of each KV head's group
  void* dv;          // [B, Hkv, Lk, D]
  const float* lse;  // fp32 [B, Hq, Lq] contiguous: the forward's LSE in the natural base

  // Workspaces, fp32 and contiguous, written by preprocess:
  float* lse_log2;  // [B, Hq, Lq_rounded]: LSE * log2(e); +inf for rows that see no key or lie past Lq
  float* dpsum;     // [B, Hq, Lq_rounded]: rowsum(dO * O); 0 past Lq
  float* dq_accum;  // [B, Hq, Lq_rounded, D]: dQ before the softmax scale
  // Deterministic kernels only (nullptr otherwise): int32 [B, Hq, Lq_rounded / block_m,
  // d_slices], one counter per query tile and head-dim slice, zeroed by preprocess. The key tiles add their dQ of a query tile
  // in increasing order: key tile n waits until the counter reads n, adds, then sets n + 1.
  int* dq_semaphore;

  // Strides in elements ([batch, head, row]; the head dimension is contiguous). Base pointers
  // and strides must be 16-byte aligned, as in the forward.
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t do_batch_stride, do_head_stride, do_row_stride;
  int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  int64_t dv_batch_stride, dv_head_stride, dv_row_stride;

  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int head_ratio;        // heads_q / heads_kv
  int seqlen_q_rounded;  // Lq rounded up to kBwdSeqlenRound
  float scale;           // softmax scale on Q K^T (natural base)
  float scale_log2;      // scale * log2(e)
};

// Grids of the three entries (x, y, z), shared by the launcher and the kernels' index math.
// Preprocess: one row of (batch, head, query) per aux_threads_per_row threads.
inline unsigned bwd_pre_blocks(const BwdParams& p, int threads_per_row) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q_rounded;
  const int64_t per_block = kBwdAuxThreads / threads_per_row;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}
// Postprocess: 8 elements of dQ per thread.
inline unsigned bwd_post_blocks(const BwdParams& p, int head_dim) {
  const int64_t chunks = int64_t(p.batch) * p.heads_q * p.seqlen_q * (head_dim / 8);
  return static_cast<unsigned>((chunks + kBwdAuxThreads - 1) / kBwdAuxThreads);
}
// Main kernel: one CTA per (key tile and head-dim slice, KV head, batch), the slice the faster
// index of x. A backward cubin's LaunchInfo (the forward's struct) carries d_slices, the CTAs
// per key tile, in its split_kv field.
inline void bwd_grid(const BwdParams& p, int block_n, int d_slices, unsigned grid[3]) {
  grid[0] = static_cast<unsigned>((p.seqlen_k + block_n - 1) / block_n * d_slices);
  grid[1] = static_cast<unsigned>(p.heads_kv);
  grid[2] = static_cast<unsigned>(p.batch);
}

// Threads that share one row in preprocess: the head dim in 8-element chunks, rounded up to a
// power of two so that a row's threads reduce with butterfly shuffles inside one warp.
constexpr int bwd_threads_per_row(int head_dim) {
  int chunks = head_dim / 8;
  int threads = 1;
  while (threads < chunks) threads *= 2;
  return threads;
}

}  // namespace cute_autotune
