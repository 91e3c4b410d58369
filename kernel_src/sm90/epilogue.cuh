// The epilogue of the sm90 family: O normalised and the LSE written by the shared collectives
// (common/softmax.h, common/epilogue.h), then each consumer warpgroup's 64 rows of O go into its
// own rows of the work tile's Q buffer by stmatrix (its Q K^Ts are done; the other warpgroups
// read only theirs) and out by one TMA store per box. Rows past Lq are clipped by the TMA unit.
// The Q buffer goes back to the producer once the store has read it (release_q_buffer).
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "../common/epilogue.h"
#include "../common/tma_params.h"
#include "traits.cuh"

namespace cute_autotune::sm90 {

using namespace cute;

template <typename Traits>
struct Epilogue {
  using Element = typename Traits::Element;

  // O of work tile w (the CTA's work tile number iter) from a consumer warpgroup's accumulator
  // and softmax state; coord_tid as in the mainloop.
  template <typename Consumer>
  __forceinline__ __device__ static void store(Consumer& c, WorkTile const& w, int iter,
                                               int coord_tid) {
    FwdParams const& p = c.params.base;
    const auto lse = c.softmax.normalize(c.acc_o, p.scale);
    write_lse<Traits::kBlockM, Traits::kHeadDim>(p, w, c.mma_pv.get_thread_slice(coord_tid), lse);
    Tensor rO = make_tensor_like<Element>(c.acc_o);
    CUTE_UNROLL
    for (int i = 0; i < size(c.acc_o); ++i) { rO(i) = Element(c.acc_o(i)); }
    Element* o_tile =
        c.smem.q.data() + (iter % Traits::kQBuffers) * Traits::kBlockM * Traits::kHeadDim;
    Tensor sO = make_tensor(make_smem_ptr(o_tile), typename Traits::SmemLayoutO{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, c.mma_pv);
    auto thr_copy_o = copy_o.get_thread_slice(c.tid);
    cute::copy(copy_o, thr_copy_o.retile_S(rO), thr_copy_o.partition_D(sO));
    tma_store_fence();  // the generic-proxy writes of sO, visible to the TMA (async proxy)
    // Named barriers 1..3 are the ping-pong turns; 4..6 one per warpgroup here.
    cutlass::arch::NamedBarrier::sync(128, 4 + c.consumer);
    if (c.elected) {
      // The wgmma tile of 64 * kConsumerWGs rows repeats down block_m; warpgroup c owns rows
      // [64c, 64c + 64) of each repeat.
      constexpr int kRepeats = Traits::kBlockM / (64 * Traits::kConsumerWGs);
      CUTE_UNROLL
      for (int r = 0; r < kRepeats; ++r) {
        const int row0 = (r * Traits::kConsumerWGs + c.consumer) * Traits::kStoreRowsO;
        CUTE_UNROLL
        for (int b = 0; b < Traits::kTmaBoxes; ++b) {
          SM90_TMA_STORE_4D::copy(&c.params.tma_o,
                                  o_tile + (b * Traits::kBlockM + row0) * Traits::kTmaBoxCols,
                                  b * Traits::kTmaBoxCols, w.m0 + row0, w.head, w.batch);
        }
      }
      tma_store_arrive();
    }
  }

  // Q buffer of work tile `iter` back to the producer, once this warpgroup's O store out of it
  // has been read (persistent schedule; a single work tile never refills its buffer).
  __forceinline__ __device__ static void release_q_buffer(typename Traits::SharedStorage& smem,
                                                          int iter, bool elected) {
    if constexpr (Traits::kPersistent) {
      if (elected) {
        tma_store_wait<0>();
        cutlass::arch::ClusterBarrier::arrive(&smem.q_empty[iter % Traits::kQBuffers]);
      }
    }
  }

  // Shared memory must outlive the last store's reads.
  __forceinline__ __device__ static void drain(bool elected) {
    if (elected) { tma_store_wait<0>(); }
  }
};

}  // namespace cute_autotune::sm90
