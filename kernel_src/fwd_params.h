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
// release). 2: LaunchInfo carries the grid schedule and the TMA boxes.
constexpr int kAbiVersion = 2;

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
};

}  // namespace cute_autotune
