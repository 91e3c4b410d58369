// FlashAttention forward on Hopper: TMA loads on an mbarrier pipeline, S = Q K^T and O += P V on
// wgmma, one producer warpgroup and kConsumerWGs consumer warpgroups (register reallocation by
// setmaxnreg). One CTA per work tile (query tile, query head, batch), the same grid as the sm80
// family; or, with kPersistent, one CTA per SM that walks the work tiles (the launcher sizes the
// grid from the kernel's exported LaunchInfo), heaviest causal tiles first.
//
// Same contract as the sm80 family (fwd_params.h): any Lq, Lk >= 1 (TMA zero-fills rows past
// the end; key columns past Lk are masked; TMA clips stores past Lq), strides through the maps,
// GQA through head_ratio, optional LSE, causal aligned bottom-right, rows that see no key give
// O = 0 and LSE = -inf.
//
// The pieces, as in FlashAttention 3's hopper/ and CUTLASS example 88: the producer and consumer
// mainloops (mainloop.cuh), the epilogue (epilogue.cuh), the work-tile schedule, masking and
// softmax shared with the other families (common/). This file only sets up the CTA, splits
// the warpgroups into their roles and walks the work tiles.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "../common/launch_info.h"
#include "../common/tile_scheduler.h"
#include "../common/tma_params.h"
#include "epilogue.cuh"
#include "mainloop.cuh"
#include "traits.cuh"

namespace cute_autotune::sm90 {

template <typename Traits>
__forceinline__ __device__ void fwd_tile(TmaFwdParams const& params, char* smem_raw) {
  using Storage = typename Traits::SharedStorage;
  using Scheduler =
      TileScheduler<Traits::kBlockM, Traits::kBlockN, Traits::kCausal, Traits::kPersistent>;
  FwdParams const& p = params.base;
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  const Scheduler scheduler(p);

  if (threadIdx.x == 0) { init_barriers<Traits>(smem); }
  __syncthreads();

  if (threadIdx.x / 128 == 0) {
    // Producer: one elected thread issues every TMA; the rest of the warpgroup gives its
    // registers to the consumers and waits.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      MainloopProducer<Traits> producer{params, smem};
      producer.prefetch_descriptors();
      for (int tile = scheduler.first, iter = 0; tile < scheduler.count;
           tile += scheduler.stride, ++iter) {
        producer.load(scheduler.tile(p, tile), iter);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  MainloopConsumer<Traits> consumer(params, smem, threadIdx.x - 128);
  consumer.first_turn();
  int kv = 0;  // K/V tiles consumed before the current work tile, over this CTA's work tiles
  consumer.reset();
  // With ping-pong, one warpgroup's epilogue runs while another's GEMMs do, across work tiles
  // too: the epilogue waits for no other warpgroup.
  for (int tile = scheduler.first, iter = 0; tile < scheduler.count;
       tile += scheduler.stride, ++iter) {
    const WorkTile w = scheduler.tile(p, tile);
    // The thread index the per-element coordinates (masking, LSE) are derived from, passed
    // through an empty asm at the top of every work tile: without it the compiler hoists all of
    // them (two ints per accumulator element) out of the persistent loop and spills them.
    int coord_tid = consumer.tid;
    asm volatile("" : "+r"(coord_tid));
    consumer.mma(w, kv, iter, coord_tid, [&]() {
      Epilogue<Traits>::release_q_buffer(smem, iter - 1, consumer.elected);
    });
    kv += w.n_tiles;
    Epilogue<Traits>::store(consumer, w, iter, coord_tid);
    consumer.reset();
  }
  Epilogue<Traits>::drain(consumer.elected);
}

}  // namespace cute_autotune::sm90

#define CUTE_AUTOTUNE_SM90_ENTRY(TRAITS)                                                   \
  CUTE_AUTOTUNE_ENTRY(TRAITS, cute_autotune::TmaFwdParams, 1024,                          \
                      cute_autotune::sm90::fwd_tile<TRAITS>)
