// The contract between the attention kernels and the launcher.
//
// Plain data only: no CUDA, CuTe or torch types, so this one header compiles both in device code
// (nvcc, every kernel family) and in the host-only launcher extension (g++). Every generated
// cubin exports a LaunchInfo next to its kernel; the launcher reads it back, so block size,
// shared memory and the grid are decided by the kernel's traits and nowhere else.
#pragma once

#include <stdint.h>

namespace cute_autotune {

// Bump whenever FwdParams, LaunchInfo or fwd_grid change. The launcher refuses a cubin whose
// LaunchInfo carries another number (a stale cache entry or a cubin from another release).
constexpr int kAbiVersion = 1;

// Symbol names inside every cubin (extern "C", so they are not mangled).
#define CUTE_AUTOTUNE_KERNEL_SYMBOL "cute_autotune_fwd"
#define CUTE_AUTOTUNE_INFO_SYMBOL "cute_autotune_fwd_info"

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

// What a compiled kernel tells its launcher. Written by the traits of the instantiated kernel.
struct LaunchInfo {
  int abi_version;
  int family;      // 80 for the sm80 family
  int head_dim;
  int dtype;       // DTypeCode
  int causal;      // 0 or 1
  int block_m;     // query rows per CTA
  int block_n;     // key/value rows per main-loop step
  int threads;     // threads per CTA
  int smem_bytes;  // dynamic shared memory per CTA
};

// One CTA per (query tile, query head, batch). x carries the query tiles because it has no
// 65535 limit; the kernels read blockIdx in the same order.
inline void fwd_grid(const LaunchInfo& info, const FwdParams& p, unsigned grid[3]) {
  grid[0] = static_cast<unsigned>((p.seqlen_q + info.block_m - 1) / info.block_m);
  grid[1] = static_cast<unsigned>(p.heads_q);
  grid[2] = static_cast<unsigned>(p.batch);
}

}  // namespace cute_autotune
