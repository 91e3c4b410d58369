// Work tiles of the forward kernels: one (query tile, query head, batch) each, the triple the
// launcher's grid is built from (launch_info.h, fwd_grid).
#pragma once

#include "../fwd_params.h"
#include "mask.h"

namespace cute_autotune {

// What one work tile covers, and how far its keys go.
struct WorkTile {
  int m_block, head, batch, kv_head;
  int m0;         // first query row
  int q_rows;     // query rows inside Lq
  int mask_from;  // first key column that may be masked (causal diagonal or Lk): mask.h
  int n_tiles;    // key tiles to visit
};

// Static: one CTA per work tile, blockIdx = (m_block, head, batch). Persistent: one CTA per
// resident slot walks the tiles first, first + stride, ... < count of one linear order. Causal
// tiles are handed out heaviest first (the last query tiles see the most keys), so the short
// ones fill the tail of the wave or of the schedule.
template <int kBlockM, int kBlockN, bool kCausal, bool kPersistent>
struct TileScheduler {
  int m_blocks;
  int count, first, stride;  // this CTA's tiles: first, first + stride, ... < count

  __forceinline__ __device__ explicit TileScheduler(FwdParams const& p)
      : m_blocks((p.seqlen_q + kBlockM - 1) / kBlockM),
        count(kPersistent ? m_blocks * p.heads_q * p.batch : 1),
        first(kPersistent ? int(blockIdx.x) : 0),
        stride(kPersistent ? int(gridDim.x) : 1) {}

  __forceinline__ __device__ WorkTile tile(FwdParams const& p, int index) const {
    WorkTile w;
    if constexpr (!kPersistent) {
      w.m_block = kCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
      w.head = blockIdx.y;
      w.batch = blockIdx.z;
    } else if constexpr (kCausal) {
      const int per_m_block = p.heads_q * p.batch;
      w.m_block = m_blocks - 1 - index / per_m_block;
      w.head = index % per_m_block % p.heads_q;
      w.batch = index % per_m_block / p.heads_q;
    } else {
      // Consecutive tiles share (head, batch), so CTAs running together share K and V in L2.
      w.m_block = index % m_blocks;
      w.head = index / m_blocks % p.heads_q;
      w.batch = index / m_blocks / p.heads_q;
    }
    w.kv_head = w.head / p.head_ratio;
    w.m0 = w.m_block * kBlockM;
    w.q_rows = min(kBlockM, p.seqlen_q - w.m0);
    const KeyRange keys = key_range<kBlockN, kCausal>(p, w.m0, w.q_rows);
    w.mask_from = keys.mask_from;
    w.n_tiles = keys.n_tiles;
    return w;
  }
};

}  // namespace cute_autotune
