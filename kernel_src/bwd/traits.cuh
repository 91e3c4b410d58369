// Traits of the backward family: every CuTe type its kernels use, derived from the config's
// plain integers and booleans (the only thing codegen emits). The static_asserts mirror the
// constraints of search_spaces/backward/bwd.toml with the same wording.
//
// This version runs on the SM80 instruction path (cp.async, ldmatrix, mma.sync m16n8k16),
// which sm_90 runs too. One CTA owns a key tile: it keeps dK and dV of that tile in registers
// over every query tile of every query head of its KV head's group, so the GQA sum costs
// nothing. Warps tile the key rows of each GEMM that produces or consumes dK and dV (S^T,
// dP^T, dV += P^T dO, dK += dS^T Q), so P^T and dS^T are reused as A operands from the
// registers they were computed in; only dS goes through shared memory, for dQ = dS K.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "../common/launch_info.h"
#include "params.h"

namespace cute_autotune::bwd {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, int kSwizzle_,
          int kDqWarpsM_, int kDSlices_, typename Element_, bool kCausal_, bool kDeterministic_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per inner step
  static constexpr int kBlockN = kBlockN_;  // key rows per CTA
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStages = kStages_;  // 1: one Q/dO buffer; 2: the next tile loads meanwhile
  static constexpr int kSwizzle = kSwizzle_;
  static constexpr int kDqWarpsM = kDqWarpsM_;  // warps along the query rows of dQ = dS K
  // CTAs per key tile, each computing dK, dV and dQ for its slice of the head dim (S^T and
  // dP^T, which need all of it, are computed by each): what keeps dK and dV in registers at
  // large head dims.
  static constexpr int kDSlices = kDSlices_;
  static constexpr int kSliceD = kHeadDim / kDSlices;
  static constexpr bool kCausal = kCausal_;
  // dQ added by the key tiles in a fixed order (params.h, dq_semaphore): bit-identical runs.
  static constexpr bool kDeterministic = kDeterministic_;

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "dtype must be fp16 or bf16");
  static_assert(kStages == 1 || kStages == 2, "stages must be 1 or 2");
  static_assert(kHeadDim % 32 == 0, "head_dim must be a multiple of 32");
  static_assert(kBlockN % (16 * kNWarps) == 0,
                "block_n must be a multiple of 16 * num_warps (warps own 16-row key slabs)");
  static_assert(kBlockM % 16 == 0 && kBwdSeqlenRound % kBlockM == 0,
                "block_m must be a multiple of 16 that divides 128");
  static_assert(kDSlices == 1 || (kDSlices == 2 && kHeadDim % 128 == 0),
                "d_slices is 1, or 2 where head_dim is a multiple of 128 (slices of whole "
                "64-column pages)");
  static_assert(kNWarps % kDqWarpsM == 0 && kBlockM % (16 * kDqWarpsM) == 0 &&
                    kSliceD % (16 * (kNWarps / kDqWarpsM)) == 0,
                "dq_warps_m must divide num_warps, block_m must be a multiple of 16 * dq_warps_m "
                "and head_dim / d_slices a multiple of 16 * num_warps / dq_warps_m");

  // Shared-memory pages as in the forward: 64 columns (128 bytes) when the width allows it,
  // so the XOR swizzle spans all 8 sixteen-byte chunks of a row; 32 columns otherwise.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kMaxSwizzle = kBlockKSmem == 64 ? 3 : 2;
  static_assert(kSwizzle == 0 || kSwizzle == kMaxSwizzle,
                "swizzle is either 0 (none) or the full span of a page");
  static constexpr int kBlockKdS = kBlockN % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzledS = kSwizzle == 0 ? 0 : (kBlockKdS == 64 ? 3 : 2);

  static constexpr int kGmemElemsPerLoad = sizeof(cute::uint128_t) / sizeof(Element);
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  static constexpr int kGmemRowsPerCopy = kNThreads / kGmemThreadsPerRow;
  static_assert(kBlockM % kGmemRowsPerCopy == 0 && kBlockN % kGmemRowsPerCopy == 0,
                "block_m and block_n must be multiples of the rows one tiled copy moves "
                "(num_warps * 32 * 8 / min(64, head_dim page))");

  // Shared memory: K and V of the CTA's key tile, kStages tiles of Q and of dO, one of dS,
  // and per Q tile its rows' LSE (base 2) and dPsum in fp32 (read there, not held in
  // registers: the accumulators leave none to spare).
  static constexpr int kSmemKBytes = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemQBytes = kStages * kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemdSBytes = kBlockM * kBlockN * int(sizeof(Element));
  static constexpr int kSmemStatsBytes = 2 * kStages * kBlockM * int(sizeof(float));
  static constexpr int kSmemBytes =
      2 * kSmemKBytes + 2 * kSmemQBytes + kSmemdSBytes + kSmemStatsBytes;
  static_assert(kSmemBytes <= 232448,
                "shared memory per CTA (((2 * block_n + 2 * stages * block_m) * head_dim + "
                "block_m * block_n) * 2 + 8 * stages * block_m bytes) exceeds the device limit");

  // dK and dV live in fp32 registers for the whole CTA; S^T and dP^T beside them per step.
  static constexpr int kAccumRegs =
      (2 * kBlockN * kSliceD + 2 * kBlockN * kBlockM) / kNThreads;
  static_assert(kAccumRegs <= 192,
                "accumulators need more than 192 registers per thread: (2 * block_n * head_dim "
                "/ d_slices + 2 * block_n * block_m) / (32 * num_warps) > 192");

  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  // S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q: M is the key rows, warps tile it.
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;
  // dQ = dS K: both operands from shared memory, so warps may tile rows and columns.
  using TiledMmadQ =
      TiledMMA<MmaAtom, Layout<Shape<Int<kDqWarpsM>, Int<kNWarps / kDqWarpsM>, _1>>,
               Tile<Int<16 * kDqWarpsM>, Int<16 * (kNWarps / kDqWarpsM)>, _16>>;

  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{},
      Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{},
                                              Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  // Transposed views of this CTA's head-dim slice (no data moves; read with ldmatrix.trans):
  // Q^T and dO^T as the B operands of dK and dV, K^T as the B operand of dQ. A slice of whole
  // 64-column pages starts kSliceD * rows elements further (tile_to_shape lays pages out one
  // after another), past every swizzle bit, so a view of it is its base pointer moved.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<kSliceD>, Int<kBlockM>, Int<kStages>>{},
                                 make_stride(Int<kBlockM>{}, _1{}, Int<kBlockM * kHeadDim>{}))));
  using SmemLayoutQtNoSwizzle = decltype(get_nonswizzle_portion(composition(
      SmemLayoutQ{},
      make_layout(Shape<Int<kSliceD>, Int<kBlockM>>{}, make_stride(Int<kBlockM>{}, _1{})))));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{},
      make_layout(Shape<Int<kSliceD>, Int<kBlockN>>{}, make_stride(Int<kBlockN>{}, _1{}))));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));
  // The slice of K and V's storage that dK and dV pass through on their way out.
  using SmemLayoutKVSlice = decltype(composition(
      SmemLayoutKV{},
      make_layout(Shape<Int<kBlockN>, Int<kSliceD>>{}, make_stride(_1{}, Int<kBlockN>{}))));

  using SmemLayoutAtomdS = decltype(composition(
      Swizzle<kSwizzledS, 3, 3>{},
      Layout<Shape<_8, Int<kBlockKdS>>, Stride<Int<kBlockKdS>, _1>>{}));
  using SmemLayoutdS = decltype(tile_to_shape(SmemLayoutAtomdS{},
                                              Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // dS^T as the key-row tiled MMA produced it, written into dS's (query, key) storage.
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{},
      make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, make_stride(Int<kBlockM>{}, _1{}))));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;            // ldmatrix
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // ldmatrix.trans
  using SmemCopyAtomOut = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  using GmemLayoutAtom = Layout<Shape<Int<kGmemRowsPerCopy>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  // Q and dO are read once per key tile of their KV head: kept in L2 (cp.async.cg skips L1).
  using GmemTiledCopy =
      decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                               GmemLayoutAtom{}, Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));
  using GmemTiledCopyOut = decltype(make_tiled_copy(
      Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{}, GmemLayoutAtom{},
      Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));

  static constexpr LaunchInfo launch_info() {
    LaunchInfo info = base_launch_info(
        80, kHeadDim, std::is_same_v<Element, cutlass::half_t> ? kDTypeFloat16 : kDTypeBFloat16,
        kCausal, kBlockM, kBlockN, kNThreads, kSmemBytes);
    info.abi_version = kBwdAbiVersion;
    info.split_kv = kDSlices;  // a backward cubin's split_kv: CTAs per key tile (params.h)
    return info;
  }
};

}  // namespace cute_autotune::bwd
