// Register views of MMA accumulators that the shared collectives work on, for both instruction
// families: mma.sync (sm80) and wgmma (sm90).
#pragma once

#include <cute/tensor.hpp>

namespace cute_autotune {

using namespace cute;

// Accumulator -> (rows, cols) of the tile this thread holds values of. The 4 lanes of a quad
// share each row, so row statistics need a quad reduction (two shuffles).
//   mma.sync m16n8: (4, MMA_M, MMA_N), 2 rows (8 apart) x 2 adjacent columns per atom
//                   -> (rows=(2, MMA_M), cols=(2, MMA_N))
//   wgmma:          ((2, 2, N/8), MMA_M, MMA_N), rows r and r+8 of each 64-row atom
//                   -> (rows=(2, MMA_M), cols=((2, N/8), MMA_N))
template <typename Layout>
__forceinline__ __device__ auto accum_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
  } else {
    static_assert(decltype(size<0>(acc))::value == 4);
    auto l = logical_divide(acc, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
    return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
  }
}

template <typename Tensor_>
__forceinline__ __device__ auto rowcol_view(Tensor_&& acc) {
  return make_tensor(acc.data(), accum_rowcol(acc.layout()));
}

}  // namespace cute_autotune
