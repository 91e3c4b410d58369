// Traits of the sm90 family: FlashAttention forward on Hopper's wgmma with TMA loads and warp
// specialisation (one producer warpgroup, kConsumerWGs consumer warpgroups). Every CuTe type is
// derived from the config's integers and booleans; the static_asserts mirror the constraints
// of search_spaces/sm90.toml with the same words.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "../common/launch_info.h"

namespace cute_autotune::sm90 {

using namespace cute;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kConsumerWGs_, int kStages_,
          int kProducerRegs_, bool kIntraWGOverlap_, bool kPingPong_, bool kPersistent_,
          typename Element_, bool kCausal_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumerWGs = kConsumerWGs_;
  static constexpr int kStages = kStages_;
  static constexpr bool kCausal = kCausal_;
  // Issue S = Q K(t)^T and O += P V(t-1) back to back, and run the softmax of tile t while the
  // second wgmma is in flight.
  static constexpr bool kIntraWGOverlap = kIntraWGOverlap_;
  // Consumer warpgroups take turns to issue their wgmmas (named barriers 1..consumer_wgs), so
  // the softmax of one overlaps the GEMMs of another. Built on the overlapped schedule.
  static constexpr bool kPingPong = kPingPong_;
  static_assert(!kPingPong || (kIntraWGOverlap && kConsumerWGs >= 2),
                "pingpong needs overlap and at least 2 consumer warpgroups");
  // One CTA per SM walks the work tiles (heaviest causal tiles first) instead of one CTA per
  // tile: barrier setup once per SM, the next tile's Q and K/V load during this tile. Q then
  // takes two tiles of shared memory (each also its tile's O staging tile).
  static constexpr bool kPersistent = kPersistent_;
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;
  static constexpr int kNThreads = 128 + kConsumerThreads;  // warpgroup 0 produces

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "dtype must be fp16 or bf16");
  static_assert(kHeadDim % 64 == 0 || kHeadDim == 32, "head_dim must be 32 or a multiple of 64");
  static_assert(kBlockM % (64 * kConsumerWGs) == 0,
                "block_m must be a multiple of 64 * consumer_wgs (wgmma tiles are 64 rows)");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "block_n must be a multiple of 16, <= 256");
  static_assert(kStages >= 2 && kStages <= 4, "kv_stages must be between 2 and 4");

  // One TMA box spans one swizzle atom of columns: 128 bytes (64 16-bit values), or 64 bytes
  // for head_dim 32. A tile of head_dim columns is head_dim / kTmaBoxCols boxes.
  static constexpr int kTmaBoxCols = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kTmaBoxes = kHeadDim / kTmaBoxCols;
  using SmemAtomK = std::conditional_t<kHeadDim % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                       GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemAtomVt = std::conditional_t<kHeadDim % 64 == 0, GMMA::Layout_MN_SW128_Atom<Element>,
                                        GMMA::Layout_MN_SW64_Atom<Element>>;
  // Q tiles in flight: the persistent schedule double-buffers Q, and each buffer is also the
  // O staging tile of its work tile's epilogue (a warpgroup writes O over its own Q rows once
  // its last Q K^T is done), so the next tile's Q loads during this whole tile.
  static constexpr int kQBuffers = kPersistent ? 2 : 1;
  using SmemLayoutO = decltype(tile_to_shape(SmemAtomK{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemAtomK{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQBuffers>>{}));
  using SmemLayoutK = decltype(tile_to_shape(
      SmemAtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V as the MN-major B operand of P V: (head_dim, block_n) coordinates over the same bytes a
  // K-major (block_n, head_dim) tile has, so TMA writes V exactly like K (16-bit types only).
  using SmemLayoutVt = decltype(tile_to_shape(
      SmemAtomVt{}, Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));

  using AtomLayoutMNK = Layout<Shape<Int<kConsumerWGs>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<64 * kConsumerWGs>, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayoutMNK{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float,
                           Shape<Int<64 * kConsumerWGs>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayoutMNK{}));

  static constexpr int kTileBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  // Each consumer warpgroup stores its own rows of O (TMA boxes of 64 rows, one wgmma atom),
  // so no warpgroup waits for another at the end of a work tile.
  static constexpr int kStoreRowsO = 64;
  static constexpr int kTileBytesKV = kBlockN * kHeadDim * int(sizeof(Element));

  // Shared memory: tiles 1024-byte aligned (the 128-byte swizzle repeats every 8 rows of 128 B).
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;  // also O
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutVt>, 1024> v;
    alignas(8) uint64_t q_full[kQBuffers];
    alignas(8) uint64_t q_empty[kQBuffers];
    alignas(8) uint64_t k_full[kStages];
    alignas(8) uint64_t k_empty[kStages];
    alignas(8) uint64_t v_full[kStages];
    alignas(8) uint64_t v_empty[kStages];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448,
                "shared memory per CTA ((block_m * (1 + persistent) + 2 * kv_stages * block_n) * "
                "head_dim * 2 bytes + barriers) exceeds the device limit");

  // Registers: setmaxnreg moves them from the producer warpgroup to the consumers. The pool is
  // 64K per SM for one CTA; values are multiples of 8.
  static constexpr int kProducerRegs = kProducerRegs_;
  static constexpr int kConsumerRegs =
      ((65536 / 128 - kProducerRegs) / kConsumerWGs) / 8 * 8 > 256
          ? 256
          : ((65536 / 128 - kProducerRegs) / kConsumerWGs) / 8 * 8;
  static_assert(kProducerRegs % 8 == 0 && kProducerRegs >= 24 && kProducerRegs <= 56,
                "producer_regs must be a multiple of 8 between 24 and 56");

  // The launcher encodes one TMA map per operand with these boxes (kTmaBoxCols columns, the
  // 128- or 64-byte swizzle span of SmemAtomK, by the rows of the tile a copy moves).
  static constexpr LaunchInfo launch_info() {
    LaunchInfo info = base_launch_info(
        90, kHeadDim, std::is_same_v<Element, cutlass::half_t> ? kDTypeFloat16 : kDTypeBFloat16,
        kCausal, kBlockM, kBlockN, kNThreads, kSmemBytes);
    info.persistent = kPersistent ? 1 : 0;
    info.tma_box_cols = kTmaBoxCols;
    info.tma_swizzle_bytes = kTmaBoxCols * int(sizeof(Element));
    info.tma_box_rows_q = kBlockM;
    info.tma_box_rows_k = kBlockN;
    info.tma_box_rows_v = kBlockN;
    info.tma_box_rows_o = kStoreRowsO;
    return info;
  }
};

}  // namespace cute_autotune::sm90
