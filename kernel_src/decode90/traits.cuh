// Traits of the decode90 family: the decode family's design (split-KV, the query heads of a KV
// head's group packed into the rows of one CTA) on Hopper's wgmma with TMA loads of K and V.
// With 8 query heads per KV head and 16 query tokens a KV head has 128 packed rows: one
// warpgroup tile of 64 rows or two, where the mma.sync decode kernel needs four CTAs of 32 rows
// that each read all of the head's K and V.
//
// The CTA is the sm90 family's (one producer warpgroup issuing TMA, 1-2 consumer warpgroups on
// wgmma, setmaxnreg); its shared storage, smem layouts and tiled MMAs are taken from
// sm90::FwdTraits unchanged (not persistent, no ping-pong: a decode CTA has one work tile).
// The static_asserts below mirror the constraints of search_spaces/decode90.toml.
#pragma once

#include "../sm90/traits.cuh"

namespace cute_autotune::decode90 {

using namespace cute;

// The producer warp keeps the next tile's page lookups and their shuffles live: at 24 registers
// (the sm90 family's) ptxas spilled 24 bytes of it, at 40 none (search_spaces/decode90.toml's
// consumer_regs mirrors this).
inline constexpr int kProducerRegs = 40;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kConsumerWGs_, int kStages_,
          bool kOverlap_, typename Element_, bool kCausal_, int kCtasPerSm_ = 1>
struct Decode90Traits
    : sm90::FwdTraits<kHeadDim_, kBlockM_, kBlockN_, kConsumerWGs_, kStages_, kProducerRegs,
                      kOverlap_, /*pingpong=*/false, /*persistent=*/false, Element_, kCausal_> {
  using Base = sm90::FwdTraits<kHeadDim_, kBlockM_, kBlockN_, kConsumerWGs_, kStages_,
                               kProducerRegs, kOverlap_, false, false, Element_, kCausal_>;
  static_assert(kHeadDim_ == 64 || kHeadDim_ == 128, "head_dim must be 64 or 128");
  static_assert(kBlockN_ == 64 || kBlockN_ == 128, "block_n must be 64 or 128");
  // CTAs per SM (the entry's launch bounds). Two: each CTA gets half the register file, so
  // ptxas compiles for 128 registers a thread and setmaxnreg moves the producer's spare ones
  // to the one consumer warpgroup (216 at a producer's 40). Two CTAs of one consumer
  // warpgroup each overlap one's serial S -> softmax -> P V chain and pipeline ramp with the
  // other's, where one CTA of two warpgroups would have to share rows or keys.
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static_assert(kCtasPerSm == 1 || kCtasPerSm == 2, "ctas_per_sm must be 1 or 2");
  static_assert(kCtasPerSm == 1 || kConsumerWGs_ == 1,
                "two CTAs per SM need one consumer warpgroup each");
  static_assert(kCtasPerSm * (Base::kSmemBytes + 1024) <= 233472,
                "ctas_per_sm CTAs of this shared memory exceed an SM's 228 KB");
  static constexpr int kConsumerRegs =
      kCtasPerSm == 1 ? Base::kConsumerRegs
                      : ((65536 / 128 / kCtasPerSm - kProducerRegs) / kConsumerWGs_) / 8 * 8;

  // Q is gathered by the consumers (its packed rows are no box of a tensor map) into the
  // K-major tile SmemLayoutO describes; 16 bytes per cp.async.
  static constexpr int kChunksPerRow = kHeadDim_ / 8;

  // K and V go through TMA maps with the sm90 boxes; Q and O do not (the launcher still
  // encodes their maps, with boxes of 64 rows that are never used).
  static constexpr LaunchInfo launch_info() {
    LaunchInfo info = Base::launch_info();
    info.tma_box_rows_q = 64;
    info.tma_box_rows_o = 64;
    info.pack_gqa = 1;
    info.split_kv = 1;
    return info;
  }
};

}  // namespace cute_autotune::decode90
