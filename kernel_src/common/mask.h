// Which keys a query row sees, for every kernel family: keys past Lk never, and with causal
// masking key j is visible to query row i iff j <= i + Lk - Lq (aligned bottom-right, as
// FlashAttention and torch.nn.attention.bias.causal_lower_right). A row that sees no key
// (possible only when causal and Lq > Lk) ends with O = 0 and LSE = -inf (softmax.h).
#pragma once

#include <cute/tensor.hpp>

#include "../fwd_params.h"

namespace cute_autotune {

using namespace cute;

// The keys of query rows [m0, m0 + q_rows): tiles [0, n_tiles) hold a key visible to at least
// one row; columns at or beyond mask_from are invisible to at least one row, so only the tiles
// reaching past it are masked (the kernels walk key tiles from the last to the first, so those
// come first).
struct KeyRange {
  int mask_from;
  int n_tiles;
};

template <int kBlockN, bool kCausal>
__forceinline__ __device__ KeyRange key_range(FwdParams const& p, int m0, int q_rows) {
  const int diagonal = p.seqlen_k - p.seqlen_q;  // row i sees keys j <= i + diagonal
  const int key_end = kCausal ? min(p.seqlen_k, m0 + q_rows + diagonal) : p.seqlen_k;
  KeyRange r;
  r.mask_from = kCausal ? min(p.seqlen_k, m0 + 1 + diagonal) : p.seqlen_k;
  r.n_tiles = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  return r;
}

// Set the scores of key tile n_block that row m0 + r may not see to -inf. thr_mma is the slice
// of the tiled MMA that produced acc_s, for the coordinates of its values.
template <int kBlockM, int kBlockN, bool kCausal, typename ThrMma, typename AccS>
__forceinline__ __device__ void apply_mask(AccS& acc_s, ThrMma const& thr_mma, FwdParams const& p,
                                           int m0, int mask_from, int n_block) {
  if ((n_block + 1) * kBlockN > mask_from) {
    const int diagonal = p.seqlen_k - p.seqlen_q;
    Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) {
      const int row = m0 + get<0>(tScS(i));
      const int col = n_block * kBlockN + get<1>(tScS(i));
      const int limit = kCausal ? min(p.seqlen_k, row + 1 + diagonal) : p.seqlen_k;
      if (col >= limit) { acc_s(i) = -INFINITY; }
    }
  }
}

}  // namespace cute_autotune
