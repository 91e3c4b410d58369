// FlashAttention-2 forward on the SM80 instruction path (cp.async, ldmatrix, mma.sync m16n8k16),
// one CTA per (query tile, query head, batch). fwd_tile is the device code; the macro at the
// end defines the __global__ entry and its LaunchInfo, once per generated translation unit.
//
// Contract (see fwd_params.h): any Lq, Lk >= 1 (tails by predicated loads with zero fill and
// guarded stores), strided rows/heads/batches, GQA/MQA through head_ratio, optional LSE.
// Masking, the online softmax, the normalise/LSE epilogue and the work-tile arithmetic are the
// collectives of common/, shared with the other families.
#pragma once

#include <cute/tensor.hpp>

#include "../common/epilogue.h"
#include "../common/launch_info.h"
#include "../common/mask.h"
#include "../common/sm80_mma.h"
#include "../common/softmax.h"
#include "../common/tile_scheduler.h"
#include "../fwd_params.h"
#include "traits.cuh"

namespace cute_autotune::sm80 {

using namespace cute;

template <typename Traits>
__forceinline__ __device__ void fwd_tile(FwdParams const& p, char* smem) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr bool kCausal = Traits::kCausal;
  constexpr bool kQInRegs = Traits::kQInRegs;

  const int tid = threadIdx.x;
  const WorkTile w = TileScheduler<kBlockM, kBlockN, kCausal, false>(p).tile(p, 0);
  const int n_tiles = w.n_tiles;

  Tensor mQ = make_tensor(
      make_gmem_ptr(static_cast<Element const*>(p.q) + w.batch * p.q_batch_stride +
                    w.head * p.q_head_stride),
      make_shape(p.seqlen_q, Int<kHeadDim>{}), make_stride(p.q_row_stride, _1{}));
  Tensor mK = make_tensor(
      make_gmem_ptr(static_cast<Element const*>(p.k) + w.batch * p.k_batch_stride +
                    w.kv_head * p.k_head_stride),
      make_shape(p.seqlen_k, Int<kHeadDim>{}), make_stride(p.k_row_stride, _1{}));
  Tensor mV = make_tensor(
      make_gmem_ptr(static_cast<Element const*>(p.v) + w.batch * p.v_batch_stride +
                    w.kv_head * p.v_head_stride),
      make_shape(p.seqlen_k, Int<kHeadDim>{}), make_stride(p.v_row_stride, _1{}));
  Tensor mO = make_tensor(
      make_gmem_ptr(static_cast<Element*>(p.o) + w.batch * p.o_batch_stride +
                    w.head * p.o_head_stride),
      make_shape(p.seqlen_q, Int<kHeadDim>{}), make_stride(p.o_row_stride, _1{}));

  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(w.m_block, 0));  // (BM,D)
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(w.m_block, 0));  // (BM,D)
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (BN,D,n)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (BN,D,n)

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});                      // (BM,D)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (BN,D,SLOT)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});  // (BN,D,SLOT)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});           // (D,BN,SLOT)
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});  // (BM,D), reuses sQ

  // Global -> shared, 16 bytes per thread per access.
  typename Traits::GmemTiledCopyQKV copy_qkv;
  auto thr_copy_qkv = copy_qkv.get_thread_slice(tid);
  Tensor tQgQ = thr_copy_qkv.partition_S(gQ);  // (CPY,CPY_M,CPY_D)
  Tensor tQsQ = thr_copy_qkv.partition_D(sQ);
  Tensor tKgK = thr_copy_qkv.partition_S(gK);  // (CPY,CPY_N,CPY_D,n)
  Tensor tKsK = thr_copy_qkv.partition_D(sK);  // (CPY,CPY_N,CPY_D,SLOT)
  Tensor tVgV = thr_copy_qkv.partition_S(gV);
  Tensor tVsV = thr_copy_qkv.partition_D(sV);
  Tensor tQcQ = thr_copy_qkv.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVcKV =
      thr_copy_qkv.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));

  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor tCrQ = thr_mma.partition_fragment_A(sQ);               // (MMA,MMA_M,MMA_D)
  Tensor tCrK = thr_mma.partition_fragment_B(sK(_, _, _0{}));   // (MMA,MMA_N,MMA_D)
  Tensor tCrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);    // (MMA,MMA_D,MMA_N)
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA,MMA_M,MMA_D)
  clear(acc_o);

  // Shared -> registers through ldmatrix, retiled onto the MMA fragments.
  auto s2r_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_thr_copy_q = s2r_copy_q.get_thread_slice(tid);
  Tensor tXsQ = s2r_thr_copy_q.partition_S(sQ);
  Tensor tXrQ = s2r_thr_copy_q.retile_D(tCrQ);
  auto s2r_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_thr_copy_k = s2r_copy_k.get_thread_slice(tid);
  Tensor tXsK = s2r_thr_copy_k.partition_S(sK);  // (CPY,CPY_N,CPY_D,SLOT)
  auto s2r_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma);
  auto s2r_thr_copy_v = s2r_copy_v.get_thread_slice(tid);
  Tensor tXsVt = s2r_thr_copy_v.partition_S(sVt);  // (CPY,CPY_D,CPY_N,SLOT)

  // O is rescaled at once after every update, so no rescale is worth tracking.
  constexpr int kRows = decltype(size<1>(acc_o))::value * 2;
  OnlineSoftmax<kRows, kCausal, false> softmax;
  softmax.reset();

  auto load_kv = [&](int n_block, int slot) {
    const int valid = p.seqlen_k - n_block * kBlockN;
    copy_rows<true>(copy_qkv, tKgK(_, _, _, n_block), tKsK(_, _, _, slot), tKVcKV, valid);
    copy_rows<true>(copy_qkv, tVgV(_, _, _, n_block), tVsV(_, _, _, slot), tKVcKV, valid);
  };
  auto load_k = [&](int n_block, int slot) {
    copy_rows<true>(copy_qkv, tKgK(_, _, _, n_block), tKsK(_, _, _, slot), tKVcKV,
                    p.seqlen_k - n_block * kBlockN);
  };
  auto load_v = [&](int n_block, int slot) {
    copy_rows<true>(copy_qkv, tVgV(_, _, _, n_block), tVsV(_, _, _, slot), tKVcKV,
                    p.seqlen_k - n_block * kBlockN);
  };
  auto load_q_fragments = [&]() { cute::copy(s2r_copy_q, tXsQ, tXrQ); };

  // S = Q K^T for key tile n_block (in smem slot `slot`), masked where a row may not see a key.
  auto scores = [&](int n_block, int slot) {
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA,MMA_M,MMA_N)
    clear(acc_s);
    gemm_rs(acc_s, tCrQ, tCrK, tXsK(_, _, _, slot), mma, s2r_copy_k, s2r_thr_copy_k,
            [&](auto k) {
              if constexpr (!kQInRegs) { cute::copy(s2r_copy_q, tXsQ(_, _, k), tXrQ(_, _, k)); }
            });
    apply_mask<kBlockM, kBlockN, kCausal>(acc_s, thr_mma, p, w.m0, w.mask_from, n_block);
    return acc_s;
  };

  // Fold one tile of scores into the running softmax and rescale O by the moved maxima.
  auto online_softmax = [&](auto& acc_s) {
    softmax.update(acc_s, p.scale_log2);
    softmax.rescale_o(acc_o);
  };

  // O += P V with P converted in place from the score accumulator (no shared-memory round trip).
  auto accumulate_pv = [&](auto const& acc_s, int slot) {
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tCrP = make_tensor(rP.data(), accum_as_operand_a(rP.layout()));
    gemm_rs(acc_o, tCrP, tCrVt, tXsVt(_, _, _, slot), mma, s2r_copy_v, s2r_thr_copy_v,
            [](auto) {});
  };

  // Key tiles run from the last to the first: the only tiles that need masking (sequence end,
  // diagonal) come first, and the loop counter doubles as the tile index.
  copy_rows<true>(copy_qkv, tQgQ, tQsQ, tQcQ, w.q_rows);
  if constexpr (kStages == 1) {
    // Single buffer: V(n) loads during Q K(n); K(n-1) loads during softmax and P V(n).
    if (n_tiles > 0) { load_k(n_tiles - 1, 0); }
    cp_async_fence();
    if constexpr (kQInRegs) {
      cp_async_wait<0>();
      __syncthreads();
      load_q_fragments();
    }
    for (int n_block = n_tiles - 1; n_block >= 0; --n_block) {
      cp_async_wait<0>();
      __syncthreads();  // K(n) landed for all threads; every warp finished P V(n+1): sV is free
      load_v(n_block, 0);
      cp_async_fence();
      auto acc_s = scores(n_block, 0);
      cp_async_wait<0>();
      __syncthreads();  // V(n) landed; every warp finished Q K(n): sK is free
      if (n_block > 0) { load_k(n_block - 1, 0); }
      cp_async_fence();
      online_softmax(acc_s);
      accumulate_pv(acc_s, 0);
    }
  } else {
    // Ring of kStages K/V slots, one cp.async group per tile: while tile t is consumed, tiles
    // t+1 .. t+kStages-1 are in flight. A group is committed every step, empty ones in the
    // tail included, so cp_async_wait<kStages - 2> always means "tile t has landed".
    CUTE_UNROLL
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) { load_kv(n_tiles - 1 - s, s); }
      cp_async_fence();
    }
    if constexpr (kQInRegs) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      load_q_fragments();
    }
    for (int t = 0; t < n_tiles; ++t) {
      const int n_block = n_tiles - 1 - t;
      const int slot = t % kStages;
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile t landed for all threads; every warp finished tile t-1, whose
                        // slot the prefetch below overwrites
      const int t_next = t + kStages - 1;
      if (t_next < n_tiles) { load_kv(n_tiles - 1 - t_next, t_next % kStages); }
      cp_async_fence();
      auto acc_s = scores(n_block, slot);
      online_softmax(acc_s);
      accumulate_pv(acc_s, slot);
    }
  }
  cp_async_wait<0>();  // drain: only empty groups can remain, but leave nothing in flight

  // Epilogue: normalise, LSE, then O through shared memory so that global stores are 16-byte
  // row chunks instead of the MMA's scattered 4-byte pairs.
  const auto lse = softmax.normalize(acc_o, p.scale);
  Tensor rO = convert_fragment<Element>(acc_o);
  auto r2s_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, mma);
  auto r2s_thr_copy_o = r2s_copy_o.get_thread_slice(tid);
  Tensor tXrO = r2s_thr_copy_o.retile_S(rO);
  Tensor tXsO = r2s_thr_copy_o.partition_D(sO);
  __syncthreads();  // sO aliases sQ: every warp must be done with its last Q K^T
  cute::copy(r2s_copy_o, tXrO, tXsO);

  write_lse<kBlockM, kHeadDim>(p, w, thr_mma, lse);

  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});

  typename Traits::GmemTiledCopyO copy_o;
  auto thr_copy_o = copy_o.get_thread_slice(tid);
  Tensor tOsO = thr_copy_o.partition_S(sO);  // (CPY,CPY_M,CPY_D)
  Tensor tOgO = thr_copy_o.partition_D(gO);
  Tensor tOcO = thr_copy_o.partition_D(cO);
  Tensor tOrO = make_tensor<Element>(shape(tOgO));
  __syncthreads();  // sO complete
  cute::copy(copy_o, tOsO, tOrO);
  copy_rows<false>(copy_o, tOrO, tOgO, tOcO, w.q_rows);
}

}  // namespace cute_autotune::sm80

// The one __global__ entry per generated translation unit, with its LaunchInfo beside it.
#define CUTE_AUTOTUNE_SM80_ENTRY(TRAITS) \
  CUTE_AUTOTUNE_ENTRY(TRAITS, cute_autotune::FwdParams, 128, cute_autotune::sm80::fwd_tile<TRAITS>)
