// Device helpers of the families on the SM80 instruction path (mma.sync m16n8k16, ldmatrix,
// cp.async): sm80 and decode. Predicated tile copies, the accumulator of S seen as the A
// operand of P V, type conversion, and the GEMM loop.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace cute_autotune {

using namespace cute;

// Copy a (CPY, CPY_ROWS, CPY_COLS) partition row by row. Rows at or beyond `valid_rows` are not
// read (they may lie past the end of the sequence) and, when kClearInvalid, are zero-filled in
// shared memory: V rows past the sequence end meet P == 0 in P V, and 0 * garbage can be NaN.
template <bool kClearInvalid, typename TiledCopy, typename SrcTensor, typename DstTensor,
          typename CoordTensor>
__forceinline__ __device__ void copy_rows(TiledCopy const& tiled_copy, SrcTensor const& src,
                                          DstTensor&& dst, CoordTensor const& coords,
                                          int valid_rows) {
  CUTE_STATIC_ASSERT_V(rank(src) == Int<3>{});
  CUTE_STATIC_ASSERT_V(size<1>(src) == size<1>(dst));
  CUTE_STATIC_ASSERT_V(size<2>(src) == size<2>(dst));
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coords(0, m, 0)) < valid_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        cute::copy(tiled_copy, src(_, m, k), dst(_, m, k));
      }
    } else if constexpr (kClearInvalid) {
      cute::clear(dst(_, m, _));
    }
  }
}

// (MMA=4, MMA_M, MMA_N) accumulator of S -> ((4, 2), MMA_M, MMA_N / 2) A operand of P V. For
// m16n8k16 the C fragments of two neighbouring n8 tiles hold exactly the A fragment of one k16
// step, so P stays in the registers it was computed in.
template <typename Layout>
__forceinline__ __device__ auto accum_as_operand_a(Layout acc_layout) {
  static_assert(decltype(size<0>(acc_layout))::value == 4);
  static_assert(decltype(rank(acc_layout))::value == 3);
  auto l = logical_divide(acc_layout, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// Element-wise conversion of a register fragment into a new fragment of the same layout.
template <typename To, typename Engine, typename Layout>
__forceinline__ __device__ auto convert_fragment(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kNumel = decltype(size(src))::value;
  Tensor dst = make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kNumel> convert;
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kNumel> const*>(src.data()));
  return dst;
}

// acc += A B over the K mode of the fragments. B streams from shared memory one k16 slice ahead
// of the MMAs (the ldmatrix of slice k+1 overlaps the MMAs of slice k); `load_a(k)` does the
// same for A when A lives in shared memory, and nothing when A is already in registers (Q kept
// in registers, or P reused from the score accumulator).
template <typename Acc, typename FragA, typename FragB, typename SmemB, typename TiledMma,
          typename ThrCopyB, typename CopyB, typename LoadA>
__forceinline__ __device__ void gemm_rs(Acc& acc, FragA const& tCrA, FragB& tCrB,
                                        SmemB const& tXsB, TiledMma const& mma,
                                        CopyB const& s2r_copy_b, ThrCopyB const& s2r_thr_copy_b,
                                        LoadA&& load_a) {
  Tensor tXrB = s2r_thr_copy_b.retile_D(tCrB);
  CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(acc));   // MMA_M
  CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(acc));   // MMA_N
  CUTE_STATIC_ASSERT_V(size<2>(tCrA) == size<2>(tCrB));  // MMA_K
  CUTE_STATIC_ASSERT_V(size<1>(tXsB) == size<1>(tXrB));
  load_a(_0{});
  cute::copy(s2r_copy_b, tXsB(_, _, _0{}), tXrB(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      load_a(k + 1);
      cute::copy(s2r_copy_b, tXsB(_, _, k + 1), tXrB(_, _, k + 1));
    }
    cute::gemm(mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

}  // namespace cute_autotune
