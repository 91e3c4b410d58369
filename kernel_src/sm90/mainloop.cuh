// The mainloop of the sm90 family, in its two warp-specialised halves: the producer issues the
// TMA loads of a work tile (Q, then K and V tile by tile into a ring of kStages stages on
// mbarriers), and each consumer warpgroup runs S = Q K^T, the online softmax and O += P V on
// wgmma over the work tile's key tiles. Masking and the softmax are the shared collectives of
// common/; what is Hopper's own here is the pipeline and the wgmma issue order.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "../common/layout.h"
#include "../common/mask.h"
#include "../common/softmax.h"
#include "../common/tile_scheduler.h"
#include "../common/tma_params.h"
#include "traits.cuh"

namespace cute_autotune::sm90 {

using namespace cute;
using cutlass::arch::ClusterBarrier;
using cutlass::arch::ClusterTransactionBarrier;

// S accumulator -> A operand of P V. For 16-bit types the register layouts coincide: columns
// [16j, 16j+16) of S are k-block j of A, so this only regroups the value mode.
template <typename Layout>
__forceinline__ __device__ auto gmma_accum_as_a(Layout acc) {
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     make_layout(get<2, 1>(l), get<2>(acc)));
}

// The mbarriers of the pipeline, set up once per CTA by thread 0. A "full" barrier completes
// when its tile's TMA bytes have landed; an "empty" one when every consumer warpgroup has
// released the stage. Work tile number `iter` of the CTA uses Q buffer iter % kQBuffers, round
// iter / kQBuffers; K/V tile number kv sits in stage kv % kStages, round kv / kStages.
template <typename Traits>
__forceinline__ __device__ void init_barriers(typename Traits::SharedStorage& smem) {
  for (int b = 0; b < Traits::kQBuffers; ++b) {
    ClusterTransactionBarrier::init(&smem.q_full[b], 1);
    ClusterBarrier::init(&smem.q_empty[b], Traits::kConsumerWGs);
  }
  for (int s = 0; s < Traits::kStages; ++s) {
    ClusterTransactionBarrier::init(&smem.k_full[s], 1);
    ClusterTransactionBarrier::init(&smem.v_full[s], 1);
    ClusterBarrier::init(&smem.k_empty[s], Traits::kConsumerWGs);
    ClusterBarrier::init(&smem.v_empty[s], Traits::kConsumerWGs);
  }
  cutlass::arch::fence_barrier_init();
}

// Producer: one elected thread issues every TMA of the CTA.
template <typename Traits>
struct MainloopProducer {
  using Element = typename Traits::Element;
  using Storage = typename Traits::SharedStorage;

  TmaFwdParams const& params;
  Storage& smem;
  int kv = 0;  // K/V tiles issued so far, over every work tile of this CTA

  __forceinline__ __device__ void prefetch_descriptors() const {
    cute::prefetch_tma_descriptor(&params.tma_q);
    cute::prefetch_tma_descriptor(&params.tma_k);
    cute::prefetch_tma_descriptor(&params.tma_v);
  }

  // Q of work tile w (the CTA's work tile number iter), then its K/V tiles.
  __forceinline__ __device__ void load(WorkTile const& w, int iter) {
    // A Q buffer is refilled once every consumer warpgroup's O store from it (two work tiles
    // back) has been read out.
    const int buf = iter % Traits::kQBuffers;
    if (iter >= Traits::kQBuffers) {
      ClusterBarrier::wait(&smem.q_empty[buf], uint32_t(iter / Traits::kQBuffers - 1) & 1);
    }
    ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full[buf], Traits::kTileBytesQ);
    CUTE_UNROLL
    for (int b = 0; b < Traits::kTmaBoxes; ++b) {
      SM90_TMA_LOAD_4D::copy(&params.tma_q, &smem.q_full[buf], 0,
                             smem.q.data() + buf * Traits::kBlockM * Traits::kHeadDim +
                                 b * Traits::kBlockM * Traits::kTmaBoxCols,
                             b * Traits::kTmaBoxCols, w.m0, w.head, w.batch);
    }
    // Key tiles from the last to the first, as in the sm80 family: only the first ones need
    // masks.
    for (int t = 0; t < w.n_tiles; ++t, ++kv) {
      const int n_block = w.n_tiles - 1 - t;
      load_kv(&params.tma_k, smem.k_full, smem.k_empty, smem.k.data(), n_block, w);
      load_kv(&params.tma_v, smem.v_full, smem.v_empty, smem.v.data(), n_block, w);
    }
  }

 private:
  // One K or V tile into its ring stage, once the consumers have freed the stage.
  __forceinline__ __device__ void load_kv(CUtensorMap const* map, uint64_t* full, uint64_t* empty,
                                          Element* ring, int n_block, WorkTile const& w) const {
    const int stage = kv % Traits::kStages;
    if (kv >= Traits::kStages) {
      ClusterBarrier::wait(&empty[stage], uint32_t(kv / Traits::kStages - 1) & 1);
    }
    ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], Traits::kTileBytesKV);
    CUTE_UNROLL
    for (int b = 0; b < Traits::kTmaBoxes; ++b) {
      SM90_TMA_LOAD_4D::copy(
          map, &full[stage], 0,
          ring + (stage * Traits::kTmaBoxes + b) * Traits::kBlockN * Traits::kTmaBoxCols,
          b * Traits::kTmaBoxCols, n_block * Traits::kBlockN, w.kv_head, w.batch);
    }
  }
};

// Consumer: one warpgroup's share of the work tile (rows [64c, 64c + 64) of every 64 *
// kConsumerWGs-row repeat). Holds O and the softmax state across the key tiles.
template <typename Traits>
struct MainloopConsumer {
  using Element = typename Traits::Element;
  using Storage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr bool kOverlap = Traits::kIntraWGOverlap;

  using AccO = decltype(partition_fragment_C(std::declval<typename Traits::TiledMmaPV>(),
                                             Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{}));
  using AccS = decltype(partition_fragment_C(std::declval<typename Traits::TiledMmaQK>(),
                                             Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using FragP = decltype(make_tensor<Element>(gmma_accum_as_a(AccS{}.layout())));
  static constexpr int kRows = decltype(size<0>(accum_rowcol(AccO{}.layout())))::value;
  // The O rescale runs after the next P V wgmma has been waited for, so it is tracked and
  // skipped when no max moved.
  using Softmax = OnlineSoftmax<kRows, Traits::kCausal, true>;

  TmaFwdParams const& params;
  Storage& smem;
  int tid;       // thread index among the consumers
  int consumer;  // consumer warpgroup
  bool elected;  // issues this warpgroup's arrivals and O stores
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  AccO acc_o;
  Softmax softmax;
  // S and P live across work tiles too: fresh ones per work tile would be undefined values
  // that the wgmma operand fences make ptxas zero at the top of every work tile.
  AccS acc_s;
  FragP tOrP;

  __forceinline__ __device__ MainloopConsumer(TmaFwdParams const& params_, Storage& smem_, int tid_)
      : params(params_), smem(smem_), tid(tid_), consumer(tid_ / 128), elected(tid_ % 128 == 0) {}

  __forceinline__ __device__ void reset() {
    clear(acc_o);
    softmax.reset();
  }

  // Ping-pong: the consumer warpgroups take turns to issue their wgmmas (named barriers
  // 1..kConsumerWGs, the previous one signals), so one's softmax runs while another's GEMMs
  // do. Every warpgroup of a CTA takes the same number of turns per work tile.
  __forceinline__ __device__ void first_turn() const {
    if constexpr (Traits::kPingPong) {
      if (consumer == Traits::kConsumerWGs - 1) {
        cutlass::arch::NamedBarrier::arrive(2 * 128, 1);  // the first turn is warpgroup 0's
      }
    }
  }
  __forceinline__ __device__ void my_turn() const {
    if constexpr (Traits::kPingPong) { cutlass::arch::NamedBarrier::sync(2 * 128, 1 + consumer); }
  }
  __forceinline__ __device__ void pass_turn() const {
    if constexpr (Traits::kPingPong) {
      cutlass::arch::NamedBarrier::arrive(2 * 128, 1 + (consumer + 1) % Traits::kConsumerWGs);
    }
  }

  // The one consumer loop, over the key tiles of work tile w (the CTA's work tile number iter;
  // kv: K/V tiles consumed before it). coord_tid: the thread index the mask coordinates are
  // derived from (see the kernel). release_prev_q() hands the previous work tile's Q buffer
  // back to the producer, after this tile's first softmax: its O store has long been read out.
  //
  // Without overlap each key tile runs S(t), softmax, P V(t) in turn. With kIntraWGOverlap,
  // S(t) and P V(t-1) are issued back to back and the softmax of tile t runs while P V(t-1) is
  // on the tensor cores: S(0) and its softmax are peeled in front of the loop and the last
  // P V after it.
  //
  // Each work tile's wgmmas are issued, waited for and read inside this call. ptxas serialises
  // every wgmma of the kernel (C7515) when a wgmma's result crosses the back edge of the tile
  // loop, which rules out issuing the next tile's first Q K^T under this tile's epilogue
  // (tried in eight arrangements; `compile` reports such a build).
  template <typename ReleasePrevQ>
  __forceinline__ __device__ void mma(WorkTile const& w, int kv, int iter, int coord_tid,
                                      ReleasePrevQ&& release_prev_q) {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA,MMA_M,MMA_K,BUFFER) descriptors
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA,MMA_N,MMA_K,STAGE)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA,MMA_N,MMA_K,STAGE)
    Tensor acc_s_as_a = make_tensor(acc_s.data(), gmma_accum_as_a(acc_s.layout()));
    const int buf = iter % Traits::kQBuffers;
    const int n = w.n_tiles;

    // S = Q K^T for K/V tile number kv (asynchronous; completes at a warpgroup_wait).
    auto issue_qk = [&](int kv) {
      ClusterTransactionBarrier::wait(&smem.k_full[kv % Traits::kStages],
                                      uint32_t(kv / Traits::kStages) & 1);
      warpgroup_fence_operand(acc_s);
      warpgroup_arrive();
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        cute::gemm(mma_qk, tSrQ(_, _, k, buf), tSrK(_, _, k, kv % Traits::kStages), acc_s);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    // O += P V for K/V tile number kv with P in registers (asynchronous).
    auto issue_pv = [&](int kv) {
      ClusterTransactionBarrier::wait(&smem.v_full[kv % Traits::kStages],
                                      uint32_t(kv / Traits::kStages) & 1);
      warpgroup_fence_operand(acc_o);
      warpgroup_fence_operand(tOrP);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOrP); ++k) {
        cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, kv % Traits::kStages), acc_o);
      }
      warpgroup_commit_batch();
    };
    // One arrival per consumer warpgroup frees a stage for the producer.
    auto release = [&](uint64_t* empty, int kv) {
      if (elected) { ClusterBarrier::arrive(&empty[kv % Traits::kStages]); }
    };
    // Every wgmma of the warpgroup done: O and P may be touched again, V's stage is free.
    auto retire_pv = [&](int kv) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      release(smem.v_empty, kv);
    };
    auto convert_p = [&]() {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrP); ++i) { tOrP(i) = Element(acc_s_as_a(i)); }
    };
    // S(t) and its softmax; with kPrevPV, P V(t-1) is issued beside S(t) and retired after the
    // softmax. The factor O must be rescaled by is left in the softmax state.
    auto scores_softmax = [&](int t, auto prev_pv) {
      constexpr bool kPrevPV = decltype(prev_pv)::value;
      my_turn();
      issue_qk(kv + t);
      if constexpr (kPrevPV) { issue_pv(kv + t - 1); }
      pass_turn();
      warpgroup_wait<kPrevPV ? 1 : 0>();  // S(t) is ready; P V(t-1) may still run
      release(smem.k_empty, kv + t);
      warpgroup_fence_operand(acc_s);
      apply_mask<kBlockM, kBlockN, Traits::kCausal>(acc_s, mma_qk.get_thread_slice(coord_tid),
                                            params.base, w.m0, w.mask_from, n - 1 - t);
      softmax.update(acc_s, params.base.scale_log2);
      if constexpr (kPrevPV) { retire_pv(kv + t - 1); }
    };

    ClusterTransactionBarrier::wait(&smem.q_full[buf], uint32_t(iter / Traits::kQBuffers) & 1);
    // One branch around the prologue, loop and tail of the overlapped schedule: with two, ptxas
    // cannot tell that P is always converted before the last P V reads it, and zeroes it.
    if (!kOverlap || n > 0) {
      if constexpr (kOverlap) {
        scores_softmax(0, cute::false_type{});
        convert_p();
      }
      for (int t = kOverlap ? 1 : 0; t < n; ++t) {
        scores_softmax(t, cute::bool_constant<kOverlap>{});
        softmax.rescale_o(acc_o);
        convert_p();
        if constexpr (!kOverlap) {
          issue_pv(kv + t);
          retire_pv(kv + t);
        }
        if (t == (kOverlap ? 1 : 0) && iter > 0) { release_prev_q(); }
      }
      if constexpr (kOverlap) {
        my_turn();
        issue_pv(kv + n - 1);
        pass_turn();
        retire_pv(kv + n - 1);
      }
    }
    if ((kOverlap ? n <= 1 : n == 0) && iter > 0) { release_prev_q(); }
  }
};

}  // namespace cute_autotune::sm90
