// Traits of the decode family: split-KV attention for a few query rows against a long KV cache,
// on the SM80 instruction path (cp.async, ldmatrix, mma.sync m16n8k16), so it runs on sm_80 and
// newer. Every CuTe type the kernel uses is derived here from the config's plain integers and
// booleans (the only thing codegen emits).
//
// Decode is memory-bound and has few query rows, so the warps of a CTA split the KEYS, not the
// rows: each K/V tile of block_n rows is loaded by all threads, warp w computes on its own
// block_n / num_warps rows of it with all block_m query rows, and the warps' partial softmax
// states are merged once at the end (decode_kernel.cuh). In shared memory each warp's rows of
// a tile form a slot of their own, so every warp works on a whole swizzled tile like an sm80
// warp does.
//
// The static_asserts below mirror the constraints of search_spaces/decode.toml, same wording.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "../common/launch_info.h"

namespace cute_autotune::decode {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, bool kPackGqa_,
          typename Element_, bool kCausal_>
struct DecodeTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;   // (query, head) rows per CTA
  static constexpr int kBlockN = kBlockN_;   // key rows per main-loop step, all warps together
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kWarpN = kBlockN / kNWarps;  // key rows of one warp per step
  static constexpr int kStages = kStages_;           // K/V tiles in flight (a cp.async ring)
  static constexpr bool kPackGqa = kPackGqa_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kSlots = kStages * kNWarps;   // smem slots of kWarpN rows, per operand

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "dtype must be fp16 or bf16");
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16 (the MMA K step)");
  static_assert(kBlockM % 16 == 0, "block_m must be a multiple of 16 (the MMA M tile)");
  static_assert(kBlockN % (16 * kNWarps) == 0,
                "block_n must be a multiple of 16 * num_warps (each warp owns 16-row MMA slabs "
                "of keys)");
  static_assert(kStages >= 2 && kStages <= 4, "kv_stages must be between 2 and 4");

  // One smem page is 64 columns (128 bytes) when the head dim allows it, fully swizzled.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 64 ? 3 : 2;

  // 16-byte chunks: the loaders walk (row, chunk) pairs of a tile with all threads.
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0,
                "block_n * head_dim / 8 must be a multiple of the threads (num_warps * 32)");

  // Shared memory: Q, then kStages K tiles and V tiles of kNWarps slots each. The epilogue
  // reuses the K/V ring for the merge of the warps: fp32 O of block_m rows plus each warp's
  // row max and row sum.
  static constexpr int kSmemQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kSmemKVBytes = 2 * kStages * kBlockN * kHeadDim * 2;
  static constexpr int kSmemMergeBytes = kBlockM * kHeadDim * 4 + 2 * kNWarps * kBlockM * 4;
  static constexpr int kSmemBytes =
      kSmemQBytes + (kSmemKVBytes > kSmemMergeBytes ? kSmemKVBytes : kSmemMergeBytes);
  static_assert(kSmemBytes <= 232448,
                "shared memory per CTA (block_m * head_dim * 2 + max(4 * kv_stages * block_n * "
                "head_dim, block_m * head_dim * 4 + 8 * num_warps * block_m) bytes) exceeds the "
                "device limit");

  // Per thread: the score tile and the O accumulator of all block_m rows, fp32.
  static constexpr int kAccumRegs = (kBlockM * kWarpN + kBlockM * kHeadDim) / 32;
  static_assert(kAccumRegs <= 192,
                "accumulators need more than 192 registers per thread: (block_m * block_n / "
                "num_warps + block_m * head_dim) / 32 > 192");

  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  // One warp per tiled MMA: each warp runs its own key slice with every query row.
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<_1, _1, _1>>, Tile<_16, _16, _16>>;

  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{},
      Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{},
                                             Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  // (warp rows, D, slot): slot = stage * kNWarps + warp.
  using SmemLayoutKV = decltype(tile_to_shape(
      SmemLayoutAtom{}, Shape<Int<kWarpN>, Int<kHeadDim>, Int<kSlots>>{}));
  // V as the B operand of P V: the same storage seen as (D, warp rows, slot), ldmatrix.trans.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_layout(Shape<Int<kHeadDim>, Int<kWarpN>, Int<kSlots>>{},
                  make_stride(Int<kWarpN>{}, _1{}, Int<kWarpN * kHeadDim>{}))));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(
      composition(SmemLayoutKV{},
                  make_layout(Shape<Int<kHeadDim>, Int<kWarpN>>{},
                              make_stride(Int<kWarpN>{}, _1{})))));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;            // ldmatrix
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // ldmatrix.trans

  static constexpr LaunchInfo launch_info() {
    LaunchInfo info = base_launch_info(
        80, kHeadDim, std::is_same_v<Element, cutlass::half_t> ? kDTypeFloat16 : kDTypeBFloat16,
        kCausal, kBlockM, kBlockN, kNThreads, kSmemBytes);
    info.pack_gqa = kPackGqa ? 1 : 0;
    info.split_kv = 1;
    return info;
  }
};

}  // namespace cute_autotune::decode
