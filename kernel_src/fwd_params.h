// The contract between the attention kernels and the launcher.
//
// Plain data only: no CUDA, CuTe or torch types, so this one header compiles both in device code
// (nvcc, every kernel family) and in the host-only launcher extension (g++). What a cubin tells
// the launcher about itself (block, shared memory, grid, TMA maps) is common/launch_info.h.
#pragma once

#include <stdint.h>

namespace cute_autotune {

// Bump whenever FwdParams, TmaFwdParams, LaunchInfo or fwd_grid change. The launcher refuses a
// cubin whose LaunchInfo carries another number (a stale cache entry or a cubin from another
// release). 2: LaunchInfo carries the grid schedule and the TMA boxes. 3: KV-cache fields in
// FwdParams (per-sequence lengths, page table, KV splits), GQA packing in LaunchInfo.
constexpr int kAbiVersion = 3;

enum DTypeCode : int { kDTypeFloat16 = 0, kDTypeBFloat16 = 1 };

struct FwdParams {
  const void* q;  // [B, Hq, Lq, D] through the strides below
  const void* k;  // [B, Hkv, Lk, D]
  const void* v;  // [B, Hkv, Lk, D]
  void* o;        // [B, Hq, Lq, D]
  float* lse;     // optional (nullptr: not written); fp32 [B, Hq, Lq], contiguous

  // Strides in elements. The head dimension is contiguous; rows, heads and batches may be
  // strided, so [B,H,L,D] and [B,L,H,D] tensors both work without a copy. Every stride and
  // base pointer must be 16-byte aligned (128-bit cp.async loads and stores).
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;

  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int head_ratio;    // heads_q / heads_kv: query head h reads key/value head h / head_ratio
  float scale;       // softmax scale on Q K^T (natural base); LSE is reported in this base
  float scale_log2;  // scale * log2(e): exp(s * scale) == exp2(s * scale_log2), one FFMA

  // KV caches (the decode family reads these; the prefill families are launched with the
  // defaults: no lengths, no pages, one split).
  // seqlens_k: optional int32 [B] on the device: the keys of batch b are rows
  //   [0, min(seqlens_k[b], seqlen_k)) of its cache; nullptr: all seqlen_k rows. Causal masking
  //   aligns each sequence's Lq queries to the end of its own keys.
  const int* seqlens_k;
  // block_table: optional int32 [B, block_table_stride]: row j of batch b lives in page
  //   block_table[b * block_table_stride + j / page_size], row j % page_size of it; K and V are
  //   then [num_pages, page_size, Hkv, D] with *_batch_stride the page stride, and seqlen_k is
  //   the table's pages times page_size. nullptr: contiguous caches.
  const int* block_table;
  int64_t block_table_stride;
  int page_size_log2;  // page_size = 1 << page_size_log2 (a power of two)
  // num_splits > 1: each CTA covers 1/num_splits of a sequence's key tiles and writes its
  //   normalised O and LSE in fp32 to o_partial [num_splits, B, Hq, Lq, D] and lse_partial
  //   [num_splits, B, Hq, Lq] (contiguous); the family's combine kernel reduces them into o and
  //   lse. 1: O and LSE are written directly.
  int num_splits;
  float* o_partial;
  float* lse_partial;
};

}  // namespace cute_autotune
