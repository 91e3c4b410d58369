// The online softmax of the FlashAttention forward, for every kernel family: per row this
// thread holds values of, the running max of the raw scores and the (thread-partial) running
// sum of exp2((s - max) * scale_log2). scale_log2 = scale * log2(e) folds the softmax scale and
// the change of base into one FFMA per score (fwd_params.h).
#pragma once

#include <cute/tensor.hpp>

#include "layout.h"

namespace cute_autotune {

using namespace cute;

// kRows: rows of the accumulator view this thread holds (accum_rowcol). kTrackMoved: note
// whether any row of the warp raised its max, so that rescale_o can skip O (warp-uniform) when
// none did; the sm90 consumer rescales O later than the softmax (a P V wgmma may still be
// accumulating into it) and past the first few key tiles of a long row the maxima rarely move.
// Without it every update's factors are applied (sm80 rescales O at once).
template <int kRows, bool kCausal, bool kTrackMoved>
struct OnlineSoftmax {
  using Stats = decltype(make_tensor<float>(Shape<Int<kRows>>{}));
  Stats row_max;
  Stats row_sum;
  Stats rescale;  // what O must be multiplied by after the last update
  bool rescale_needed = true;

  __forceinline__ __device__ void reset() {
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  }

  // Fold one tile of scores into the running max and sum and turn the scores into exp2
  // weights in place. O is not touched: rescale_o applies the factors.
  template <typename AccS>
  __forceinline__ __device__ void update(AccS& acc_s, float scale_log2) {
    Tensor s = rowcol_view(acc_s);  // (rows, BN cols)
    static_assert(decltype(size<0>(s))::value == kRows);
    bool max_moved = false;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float m = row_max(mi);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) { m = fmaxf(m, s(mi, ni)); }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      const float prev = row_max(mi);
      row_max(mi) = m;
      // A row that has seen only masked keys keeps max -inf: subtract 0 so that its weights are
      // exp2(-inf) = 0 rather than NaN. Without causal every tile gives every row a visible key.
      const float max_scaled = ((kCausal && m == -INFINITY) ? 0.f : m) * scale_log2;
      if constexpr (kTrackMoved) {
        // An unchanged max rescales by exactly 1.
        max_moved |= m != prev;
        rescale(mi) = m == prev ? 1.f : exp2f(prev * scale_log2 - max_scaled);
      } else {
        rescale(mi) = exp2f(prev * scale_log2 - max_scaled);
      }
      float sum = 0.f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) {
        s(mi, ni) = exp2f(s(mi, ni) * scale_log2 - max_scaled);
        sum += s(mi, ni);
      }
      row_sum(mi) = row_sum(mi) * rescale(mi) + sum;
    }
    if constexpr (kTrackMoved) { rescale_needed = __any_sync(0xffffffffu, max_moved); }
  }

  template <typename AccO>
  __forceinline__ __device__ void rescale_o(AccO& acc_o) const {
    if constexpr (kTrackMoved) {
      if (!rescale_needed) { return; }
    }
    Tensor o = rowcol_view(acc_o);  // (rows, D cols)
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o); ++di) { o(mi, di) *= rescale(mi); }
    }
  }

  // End of a work tile: O divided by the full row sums (reduced across the quad), and the
  // log-sum-exp of each row's scaled scores in the natural base. sum == 0 only for a row that
  // sees no key: O stays 0 and LSE is -inf.
  template <typename AccO>
  __forceinline__ __device__ Stats normalize(AccO& acc_o, float scale) const {
    Tensor o = rowcol_view(acc_o);
    Stats lse;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float sum = row_sum(mi);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float inv_sum = sum == 0.f ? 1.f : 1.f / sum;
      lse(mi) = sum == 0.f ? -INFINITY : row_max(mi) * scale + __logf(sum);
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o); ++di) { o(mi, di) *= inv_sum; }
    }
    return lse;
  }
};

}  // namespace cute_autotune
