// Traits of the sm80 FlashAttention-2 forward family: every CuTe type the kernel uses, derived
// from the config's plain integers and booleans (the only thing codegen emits).
//
// The static_asserts below mirror the constraints declared in search_spaces/sm80.toml, with the
// same wording, so a config that slips past the Python check still fails at nvcc with a reason.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "../common/launch_info.h"

namespace cute_autotune::sm80 {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, int kSwizzle_,
          bool kQInRegs_, typename Element_, bool kCausal_>
struct FwdTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  // 1 = the single-buffer schedule; >= 2 = a ring of that many K/V tiles.
  static constexpr int kStages = kStages_;
  static constexpr int kSmemSlots = kStages < 2 ? 1 : kStages;
  static constexpr int kSwizzle = kSwizzle_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr bool kCausal = kCausal_;

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "dtype must be fp16 or bf16");
  static_assert(kStages >= 1 && kStages <= 4, "kv_stages must be between 1 and 4");
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16 (the MMA K step)");
  static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16 (the MMA N tile)");
  static_assert(kBlockM % (16 * kNWarps) == 0,
                "block_m must be a multiple of 16 * num_warps (each warp owns 16-row MMA slabs)");

  // One smem "page" is 64 columns (128 bytes of 16-bit values) when the head dim allows it, so
  // that the XOR swizzle spans all 8 sixteen-byte chunks of a row; 32 columns otherwise.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kMaxSwizzle = kBlockKSmem == 64 ? 3 : 2;
  static_assert(kSwizzle >= 0 && kSwizzle <= kMaxSwizzle,
                "swizzle must be between 0 and 3 (head_dim % 64 == 0) or 0 and 2 (otherwise)");

  // Global <-> shared copies: 8 elements (16 bytes) per thread per access. Threads of a row
  // cover one smem page, not the whole head dim: with 16 threads per row at D=128 the two halves
  // of a warp would write the same banks of two pages.
  static constexpr int kGmemElemsPerLoad = sizeof(cute::uint128_t) / sizeof(Element);
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  static constexpr int kGmemRowsPerCopy = kNThreads / kGmemThreadsPerRow;
  static_assert(kBlockM % kGmemRowsPerCopy == 0 && kBlockN % kGmemRowsPerCopy == 0,
                "block_m and block_n must be multiples of the rows one tiled copy moves "
                "(num_warps * 32 * 8 / min(64, head_dim page))");

  // Shared memory: Q (reused for O in the epilogue), then kSmemSlots K tiles and V tiles.
  static constexpr int kSmemQBytes = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemKVTileBytes = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemSlots * kSmemKVTileBytes;
  // 227 KB is the opt-in limit per block on sm_90 (sm_80: 163 KB); the device check is the
  // space's job, this only rejects what no GPU of the family can run.
  static_assert(kSmemBytes <= 232448,
                "shared memory per CTA ((block_m + 2 * max(kv_stages, 1) * block_n) * head_dim * "
                "2 bytes) exceeds the device limit");

  // Register budget: the fp32 score and output accumulators (plus Q fragments when kept in
  // registers) must leave room for addresses, indices and softmax state under 255.
  static constexpr int kAccumRegs =
      (kBlockM * kBlockN + kBlockM * kHeadDim + (kQInRegs ? kBlockM * kHeadDim / 2 : 0)) /
      kNThreads;
  static_assert(kAccumRegs <= 224,
                "accumulators need more than 224 registers per thread: (block_m * block_n + "
                "block_m * head_dim * (1.5 if q_in_regs else 1)) / (32 * num_warps) > 224");

  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  // Warps tile M only, so each warp owns whole score rows and the row max / row sum of the
  // online softmax never cross warps (4 lanes of a quad share a row).
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;

  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{},
      Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{},
                                             Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(
      SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kSmemSlots>>{}));
  // V read as the B operand of P V needs (head_dim, block_n) coordinates: the same storage seen
  // transposed, loaded with ldmatrix.trans. No data moves for the transpose.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kSmemSlots>>{},
                  make_stride(Int<kBlockN>{}, _1{}, Int<kBlockN * kHeadDim>{}))));
  // Register fragments are sized from the plain (unswizzled) layout of one slot.
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(
      composition(SmemLayoutKV{},
                  make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{},
                              make_stride(Int<kBlockN>{}, _1{})))));
  using SmemLayoutO = SmemLayoutQ;

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;            // ldmatrix
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // ldmatrix.trans
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  using GmemLayoutAtom = Layout<Shape<Int<kGmemRowsPerCopy>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  // cp.async.cg: Q, K and V are each read once per CTA, so they bypass L1.
  using GmemTiledCopyQKV =
      decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                               GmemLayoutAtom{}, Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{}, GmemLayoutAtom{},
      Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));

  static constexpr LaunchInfo launch_info() {
    return base_launch_info(
        80, kHeadDim, std::is_same_v<Element, cutlass::half_t> ? kDTypeFloat16 : kDTypeBFloat16,
        kCausal, kBlockM, kBlockN, kNThreads, kSmemBytes);
  }
};

}  // namespace cute_autotune::sm80
