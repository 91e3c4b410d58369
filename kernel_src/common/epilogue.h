// The part of the forward epilogue every family shares: O normalised by the row sums and the
// LSE computed (OnlineSoftmax::normalize), the LSE rows written here. Storing O itself is the
// family's (sm80: through shared memory to 16-byte row chunks; sm90: stmatrix and TMA).
#pragma once

#include <cute/tensor.hpp>

#include "../fwd_params.h"
#include "layout.h"
#include "tile_scheduler.h"

namespace cute_autotune {

using namespace cute;

// LSE of the rows of work tile w that lie inside Lq, fp32 [B, Hq, Lq]. The four lanes of a quad
// hold the same row statistics; the one holding column 0 writes. thr_mma: the slice of the P V
// tiled MMA whose accumulator `lse` was computed from.
template <int kBlockM, int kHeadDim, typename ThrMma, typename Lse>
__forceinline__ __device__ void write_lse(FwdParams const& p, WorkTile const& w,
                                          ThrMma const& thr_mma, Lse const& lse) {
  if (p.lse == nullptr) { return; }
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tOcO_rowcol = rowcol_view(tOcO);
  float* lse_rows = p.lse + (int64_t(w.batch) * p.heads_q + w.head) * p.seqlen_q + w.m0;
  if (get<1>(tOcO_rowcol(0, 0)) == 0) {
    CUTE_UNROLL
    for (int mi = 0; mi < size<0>(tOcO_rowcol); ++mi) {
      const int row = get<0>(tOcO_rowcol(mi, 0));
      if (row < w.q_rows) { lse_rows[row] = lse(mi); }
    }
  }
}

}  // namespace cute_autotune
