// What a compiled kernel tells its launcher, and the grid rule both sides share.
//
// Plain data only, like fwd_params.h: this header compiles in device code (every kernel family
// exports one LaunchInfo from its traits, as the symbol CUTE_AUTOTUNE_INFO_SYMBOL) and in the
// host-only launcher (g++). Every difference between families that the launcher has to know
// about (block, shared memory, grid schedule, TMA maps) is a field here, so the launcher has no
// branch on the family and no copy of a family's layout rules.
#pragma once

#include "../fwd_params.h"

namespace cute_autotune {

// Symbol names inside every cubin (extern "C", so they are not mangled).
#define CUTE_AUTOTUNE_KERNEL_SYMBOL "cute_autotune_fwd"
#define CUTE_AUTOTUNE_INFO_SYMBOL "cute_autotune_fwd_info"
// Optional second entry: reduces the fp32 partial results of a split-KV launch (split_kv below).
#define CUTE_AUTOTUNE_COMBINE_SYMBOL "cute_autotune_combine"

// Written by the traits of the instantiated kernel; autotune/cubin.py reads the same fields
// from the ELF in this order.
struct LaunchInfo {
  int abi_version;
  int family;      // 80, 90, ...: reported, never branched on
  int head_dim;
  int dtype;       // DTypeCode
  int causal;      // 0 or 1
  int block_m;     // query rows per work tile
  int block_n;     // key/value rows per main-loop step
  int threads;     // threads per CTA
  int smem_bytes;  // dynamic shared memory per CTA
  // 0: one CTA per work tile. 1: one CTA per resident slot of the device, each walking the work
  // tiles blockIdx.x, blockIdx.x + gridDim.x, ... (common/tile_scheduler.h).
  int persistent;
  // 0: the kernel takes FwdParams. Otherwise it takes TmaFwdParams (common/tma_params.h), whose
  // four maps have boxes of tma_box_cols columns by the rows below, swizzled over
  // tma_swizzle_bytes (the swizzle span of the kernel's shared-memory layout).
  int tma_box_cols;
  int tma_swizzle_bytes;
  int tma_box_rows_q, tma_box_rows_k, tma_box_rows_v, tma_box_rows_o;
  // 1: a CTA's block_m rows are (query, head) pairs of one KV head's group, row r being query
  // r / group of head kv_head * group + r % group, so each K/V tile is read once per group.
  int pack_gqa;
  // 1: the kernel takes num_splits > 1 and its cubin carries the combine entry.
  int split_kv;
};

// The combine entry: one warp per (batch, head, query) row, kCombineWarps rows per CTA.
constexpr int kCombineWarps = 4;

// The fields every family fills the same way; each traits adds its schedule and TMA fields.
constexpr LaunchInfo base_launch_info(int family, int head_dim, DTypeCode dtype, bool causal,
                                      int block_m, int block_n, int threads, int smem_bytes) {
  LaunchInfo info{};
  info.abi_version = kAbiVersion;
  info.family = family;
  info.head_dim = head_dim;
  info.dtype = dtype;
  info.causal = causal ? 1 : 0;
  info.block_m = block_m;
  info.block_n = block_n;
  info.threads = threads;
  info.smem_bytes = smem_bytes;
  return info;
}

// Work tiles are (query tile, query head, batch); x carries the query tiles because it has no
// 65535 limit. A persistent kernel gets min(tiles, resident_ctas) CTAs along x instead, and
// the kernel's tile scheduler maps a linear tile index back to the same triple.
// With GQA packing the rows of a work tile run over (query, head of the group) and y over KV
// heads; with KV splits x runs over (split, query tile), the split being the slower index.
inline void fwd_grid(const LaunchInfo& info, const FwdParams& p, unsigned resident_ctas,
                     unsigned grid[3]) {
  const int64_t rows = int64_t(p.seqlen_q) * (info.pack_gqa != 0 ? p.head_ratio : 1);
  const unsigned m_blocks = static_cast<unsigned>((rows + info.block_m - 1) / info.block_m);
  if (info.pack_gqa != 0 || info.split_kv != 0) {
    grid[0] = m_blocks * unsigned(p.num_splits);
    grid[1] = static_cast<unsigned>(info.pack_gqa != 0 ? p.heads_kv : p.heads_q);
    grid[2] = static_cast<unsigned>(p.batch);
  } else if (info.persistent != 0) {
    const uint64_t tiles = uint64_t(m_blocks) * unsigned(p.heads_q) * unsigned(p.batch);
    grid[0] = static_cast<unsigned>(tiles < resident_ctas ? tiles : resident_ctas);
    grid[1] = 1;
    grid[2] = 1;
  } else {
    grid[0] = m_blocks;
    grid[1] = static_cast<unsigned>(p.heads_q);
    grid[2] = static_cast<unsigned>(p.batch);
  }
}

// Grid of the combine entry: one warp per output row.
inline unsigned combine_grid(const FwdParams& p) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  return static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps);
}

}  // namespace cute_autotune

// The one __global__ entry of a generated translation unit, with its LaunchInfo beside it.
// PARAMS: the kernel's parameter struct (FwdParams, or TmaFwdParams when LaunchInfo says TMA);
// BODY(params, smem): the family's device code for one CTA.
#define CUTE_AUTOTUNE_ENTRY(TRAITS, PARAMS, SMEM_ALIGN, BODY)                                 \
  extern "C" __constant__ cute_autotune::LaunchInfo cute_autotune_fwd_info =                  \
      TRAITS::launch_info();                                                                   \
  extern "C" __global__ void __launch_bounds__(TRAITS::kNThreads, 1)                           \
      cute_autotune_fwd(const __grid_constant__ PARAMS params) {                               \
    extern __shared__ __align__(SMEM_ALIGN) char smem[];                                       \
    BODY(params, smem);                                                                        \
  }
