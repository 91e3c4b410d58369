// FlashAttention forward on Hopper: TMA loads on an mbarrier pipeline, S = Q K^T and O += P V on
// wgmma, one producer warpgroup and kConsumerWGs consumer warpgroups (register reallocation by
// setmaxnreg). One CTA per work tile (query tile, query head, batch), the same grid as the sm80
// family; or, with kPersistent, one CTA per SM that walks the work tiles (the launcher sizes the
// grid from the kernel's exported schedule), heaviest causal tiles first.
//
// Same contract as the sm80 family (fwd_params.h): any Lq, Lk >= 1 (TMA zero-fills rows past
// the end; key columns past Lk are masked; TMA clips stores past Lq), strides through the maps,
// GQA through head_ratio, optional LSE, causal aligned bottom-right, rows that see no key give
// O = 0 and LSE = -inf.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "params.h"
#include "traits.cuh"

namespace cute_autotune::sm90 {

using namespace cute;
using cutlass::arch::ClusterBarrier;
using cutlass::arch::ClusterTransactionBarrier;

// ((2,2,N/8), MMA_M, MMA_N) wgmma accumulator -> (rows=(2, MMA_M), cols=((2,N/8), MMA_N)).
// Each thread holds rows r and r+8 of every 64-row atom; the 4 lanes of a quad share a row.
template <typename Layout>
__forceinline__ __device__ auto gmma_rowcol(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// S accumulator -> A operand of P V. For 16-bit types the register layouts coincide: columns
// [16j, 16j+16) of S are k-block j of A, so this only regroups the value mode.
template <typename Layout>
__forceinline__ __device__ auto gmma_accum_as_a(Layout acc) {
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     make_layout(get<2, 1>(l), get<2>(acc)));
}

// What one work tile covers, and how far its keys go.
struct WorkTile {
  int m_block, head, batch, kv_head;
  int m0;         // first query row
  int q_rows;     // query rows inside Lq
  int mask_from;  // first key column that may be masked (causal diagonal or Lk)
  int n_tiles;    // key tiles to visit
};

// Work tile `index` of `count`. Causal tiles are handed out heaviest first (the last query tiles
// see the most keys), so the short ones fill the tail of the schedule.
template <typename Traits>
__forceinline__ __device__ WorkTile work_tile(FwdParams const& p, int index, int m_blocks) {
  WorkTile w;
  if constexpr (!Traits::kPersistent) {
    w.m_block = Traits::kCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
    w.head = blockIdx.y;
    w.batch = blockIdx.z;
  } else if constexpr (Traits::kCausal) {
    const int per_m_block = p.heads_q * p.batch;
    w.m_block = m_blocks - 1 - index / per_m_block;
    w.head = index % per_m_block % p.heads_q;
    w.batch = index % per_m_block / p.heads_q;
  } else {
    // Consecutive tiles share (head, batch), so CTAs running together share K and V in L2.
    w.m_block = index % m_blocks;
    w.head = index / m_blocks % p.heads_q;
    w.batch = index / m_blocks / p.heads_q;
  }
  w.kv_head = w.head / p.head_ratio;
  w.m0 = w.m_block * Traits::kBlockM;
  w.q_rows = min(Traits::kBlockM, p.seqlen_q - w.m0);
  const int diagonal = p.seqlen_k - p.seqlen_q;
  const int key_end =
      Traits::kCausal ? min(p.seqlen_k, w.m0 + w.q_rows + diagonal) : p.seqlen_k;
  w.mask_from = Traits::kCausal ? min(p.seqlen_k, w.m0 + 1 + diagonal) : p.seqlen_k;
  w.n_tiles = key_end > 0 ? (key_end + Traits::kBlockN - 1) / Traits::kBlockN : 0;
  return w;
}

template <typename Traits>
__forceinline__ __device__ void fwd_tile(Sm90FwdParams const& params, char* smem_raw) {
  using Element = typename Traits::Element;
  using Storage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kQBuffers = Traits::kQBuffers;
  constexpr bool kCausal = Traits::kCausal;
  constexpr int kBoxCols = Traits::kTmaBoxCols;
  constexpr int kBoxes = kHeadDim / kBoxCols;
  constexpr int kTileElemsQ = kBlockM * kHeadDim;

  FwdParams const& p = params.base;
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int diagonal = p.seqlen_k - p.seqlen_q;
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  // Work tiles of this CTA: blockIdx.x, + gridDim.x, ... in the persistent schedule; else one.
  // Work tile number `iter` of the CTA uses Q buffer iter % kQBuffers, round iter / kQBuffers.
  const int tile_count = Traits::kPersistent ? m_blocks * p.heads_q * p.batch : 1;
  const int tile_first = Traits::kPersistent ? int(blockIdx.x) : 0;
  const int tile_stride = Traits::kPersistent ? int(gridDim.x) : 1;

  if (threadIdx.x == 0) {
    for (int b = 0; b < kQBuffers; ++b) {
      ClusterTransactionBarrier::init(&smem.q_full[b], 1);
      ClusterBarrier::init(&smem.q_empty[b], Traits::kConsumerWGs);
    }
    for (int s = 0; s < kStages; ++s) {
      ClusterTransactionBarrier::init(&smem.k_full[s], 1);
      ClusterTransactionBarrier::init(&smem.v_full[s], 1);
      ClusterBarrier::init(&smem.k_empty[s], Traits::kConsumerWGs);
      ClusterBarrier::init(&smem.v_empty[s], Traits::kConsumerWGs);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp_group == 0) {
    // Producer: one elected thread issues every TMA; the rest of the warpgroup gives its
    // registers to the consumers and waits.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      cute::prefetch_tma_descriptor(&params.tma_q);
      cute::prefetch_tma_descriptor(&params.tma_k);
      cute::prefetch_tma_descriptor(&params.tma_v);
      // One K or V tile into its ring stage, once the consumers have freed the stage.
      auto load_kv = [&](CUtensorMap const* map, uint64_t* full, uint64_t* empty, Element* ring,
                         int kv, int n_block, WorkTile const& w) {
        const int stage = kv % kStages;
        if (kv >= kStages) { ClusterBarrier::wait(&empty[stage], uint32_t(kv / kStages - 1) & 1); }
        ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], Traits::kTileBytesKV);
        CUTE_UNROLL
        for (int b = 0; b < kBoxes; ++b) {
          SM90_TMA_LOAD_4D::copy(map, &full[stage], 0,
                                 ring + (stage * kBoxes + b) * kBlockN * kBoxCols, b * kBoxCols,
                                 n_block * kBlockN, w.kv_head, w.batch);
        }
      };
      int kv = 0;  // K/V tiles issued so far, over every work tile of this CTA
      for (int tile = tile_first, iter = 0; tile < tile_count; tile += tile_stride, ++iter) {
        const WorkTile w = work_tile<Traits>(p, tile, m_blocks);
        // A Q buffer is refilled once every consumer warpgroup's O store from it (two work
        // tiles back) has been read out.
        const int buf = iter % kQBuffers;
        if (iter >= kQBuffers) {
          ClusterBarrier::wait(&smem.q_empty[buf], uint32_t(iter / kQBuffers - 1) & 1);
        }
        ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full[buf], Traits::kTileBytesQ);
        CUTE_UNROLL
        for (int b = 0; b < kBoxes; ++b) {
          SM90_TMA_LOAD_4D::copy(&params.tma_q, &smem.q_full[buf], 0,
                                 smem.q.data() + buf * kTileElemsQ + b * kBlockM * kBoxCols,
                                 b * kBoxCols, w.m0, w.head, w.batch);
        }
        // Key tiles from the last to the first, as in the sm80 family: only the first ones need
        // masks. K/V tile number kv sits in stage kv % kStages.
        for (int t = 0; t < w.n_tiles; ++t, ++kv) {
          const int n_block = w.n_tiles - 1 - t;
          load_kv(&params.tma_k, smem.k_full, smem.k_empty, smem.k.data(), kv, n_block, w);
          load_kv(&params.tma_v, smem.v_full, smem.v_empty, smem.v.data(), kv, n_block, w);
        }
      }
    }
    return;
  }

  // Consumers.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = threadIdx.x - 128;
  const int consumer = tid / 128;
  const bool elected = tid % 128 == 0;  // issues this warpgroup's arrivals and O stores
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA,MMA_M,MMA_K,BUFFER) descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA,MMA_N,MMA_K,STAGE)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA,MMA_N,MMA_K,STAGE)
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  // The thread index the per-element coordinates (masking, LSE) are derived from, passed
  // through an empty asm at the top of every work tile: without it the compiler hoists all of
  // them (two ints per accumulator element) out of the persistent loop and spills them.
  int coord_tid = tid;

  constexpr int kRows = decltype(size<0>(gmma_rowcol(acc_o.layout())))::value;
  Tensor row_max = make_tensor<float>(Shape<Int<kRows>>{});
  Tensor row_sum = make_tensor<float>(Shape<Int<kRows>>{});

  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tOrP = make_tensor<Element>(gmma_accum_as_a(acc_s.layout()));
  Tensor acc_s_as_a = make_tensor(acc_s.data(), gmma_accum_as_a(acc_s.layout()));
  Tensor s_rowcol = make_tensor(acc_s.data(), gmma_rowcol(acc_s.layout()));
  Tensor o_rowcol = make_tensor(acc_o.data(), gmma_rowcol(acc_o.layout()));
  Tensor rescale = make_tensor<float>(Shape<Int<kRows>>{});
  bool rescale_needed = true;  // some row of this warp raised its max in the last softmax

  // Issue S = Q K^T for K/V tile number kv of the CTA against Q buffer buf (asynchronous;
  // completes at a warpgroup_wait).
  auto issue_qk = [&](int kv, int buf) {
    ClusterTransactionBarrier::wait(&smem.k_full[kv % kStages], uint32_t(kv / kStages) & 1);
    warpgroup_fence_operand(acc_s);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tSrQ); ++k) {
      cute::gemm(mma_qk, tSrQ(_, _, k, buf), tSrK(_, _, k, kv % kStages), acc_s);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  // Issue O += P V for K/V tile number kv with P in registers (asynchronous).
  auto issue_pv = [&](int kv) {
    ClusterTransactionBarrier::wait(&smem.v_full[kv % kStages], uint32_t(kv / kStages) & 1);
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOrP); ++k) {
      cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, kv % kStages), acc_o);
    }
    warpgroup_commit_batch();
  };
  // One arrival per consumer warpgroup frees a stage for the producer.
  auto release = [&](uint64_t* empty, int kv) {
    if (elected) { ClusterBarrier::arrive(&empty[kv % kStages]); }
  };
  // Mask S (key tile n_block of work tile w), fold it into the running max and sum, turn it
  // into exp2 weights, and leave the factor the output must be rescaled by in `rescale` (O
  // itself is not touched here: with the intra-warpgroup overlap a P V wgmma may still be
  // accumulating into it).
  auto softmax = [&](WorkTile const& w, int n_block) {
    warpgroup_fence_operand(acc_s);
    if ((n_block + 1) * kBlockN > w.mask_from) {
      Tensor tScS = mma_qk.get_thread_slice(coord_tid).partition_C(
          make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int row = w.m0 + get<0>(tScS(i));
        const int col = n_block * kBlockN + get<1>(tScS(i));
        const int limit = kCausal ? min(p.seqlen_k, row + 1 + diagonal) : p.seqlen_k;
        if (col >= limit) { acc_s(i) = -INFINITY; }
      }
    }
    bool max_moved = false;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float m = row_max(mi);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s_rowcol); ++ni) { m = fmaxf(m, s_rowcol(mi, ni)); }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      const float prev = row_max(mi);
      row_max(mi) = m;
      // A row that has seen only masked keys keeps max -inf: subtract 0 so exp2 gives 0.
      const float max_scaled = ((kCausal && m == -INFINITY) ? 0.f : m) * p.scale_log2;
      // An unchanged max rescales by exactly 1, so O can skip the multiply (rescale_o).
      max_moved |= m != prev;
      rescale(mi) = m == prev ? 1.f : exp2f(prev * p.scale_log2 - max_scaled);
      float sum = 0.f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s_rowcol); ++ni) {
        s_rowcol(mi, ni) = exp2f(s_rowcol(mi, ni) * p.scale_log2 - max_scaled);
        sum += s_rowcol(mi, ni);
      }
      row_sum(mi) = row_sum(mi) * rescale(mi) + sum;
    }
    // Warp-uniform, so the skip in rescale_o is a branch, not a divergence: past the first few
    // key tiles of a long row the maxima rarely move, and the multiplies are a tenth of the
    // softmax's instructions at head_dim 128.
    rescale_needed = __any_sync(0xffffffffu, max_moved);
  };
  auto rescale_o = [&]() {
    if (!rescale_needed) { return; }
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o_rowcol); ++di) { o_rowcol(mi, di) *= rescale(mi); }
    }
  };
  auto convert_p = [&]() {
    CUTE_UNROLL
    for (int i = 0; i < size(tOrP); ++i) { tOrP(i) = Element(acc_s_as_a(i)); }
  };
  auto reset_row_state = [&]() {
    clear(acc_o);
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  };
  // Ping-pong: the consumer warpgroups take turns to issue their wgmmas (named barrier per
  // warpgroup, the previous one signals), so one's softmax runs while another's GEMMs do.
  // Every warpgroup of a CTA takes the same number of turns per work tile.
  auto my_turn = [&]() {
    if constexpr (Traits::kPingPong) {
      cutlass::arch::NamedBarrier::sync(2 * 128, 1 + consumer);
    }
  };
  auto pass_turn = [&]() {
    if constexpr (Traits::kPingPong) {
      cutlass::arch::NamedBarrier::arrive(2 * 128, 1 + (consumer + 1) % Traits::kConsumerWGs);
    }
  };
  auto wait_q = [&](int iter) {
    ClusterTransactionBarrier::wait(&smem.q_full[iter % kQBuffers],
                                    uint32_t(iter / kQBuffers) & 1);
  };
  // Q buffer of work tile `iter` back to the producer, once this warpgroup's O store out of it
  // has been read (persistent schedule; a single work tile never refills its buffer). Called
  // one work tile later, after that tile's first softmax, so the store has long finished.
  auto free_q_buffer = [&](int iter) {
    if constexpr (Traits::kPersistent) {
      if (elected) {
        tma_store_wait<0>();
        ClusterBarrier::arrive(&smem.q_empty[iter % kQBuffers]);
      }
    }
  };
  // Epilogue of work tile w: normalise, LSE, then this warpgroup's 64 rows of O over its own Q
  // rows (its Q K^Ts are done; the other warpgroups read only theirs) by stmatrix, and out by
  // one TMA store per box. Rows past Lq are clipped by the TMA unit.
  auto store_o = [&](WorkTile const& w, int iter) {
    Tensor lse = make_tensor<float>(Shape<Int<kRows>>{});
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float sum = row_sum(mi);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float inv_sum = sum == 0.f ? 1.f : 1.f / sum;
      lse(mi) = sum == 0.f ? -INFINITY : row_max(mi) * p.scale + __logf(sum);
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o_rowcol); ++di) { o_rowcol(mi, di) *= inv_sum; }
    }
    if (p.lse != nullptr) {
      Tensor tOcO = mma_pv.get_thread_slice(coord_tid).partition_C(
          make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
      Tensor tOcO_rowcol = make_tensor(tOcO.data(), gmma_rowcol(tOcO.layout()));
      float* lse_rows = p.lse + (int64_t(w.batch) * p.heads_q + w.head) * p.seqlen_q + w.m0;
      if (get<1>(tOcO_rowcol(0, 0)) == 0) {
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi) {
          const int row = get<0>(tOcO_rowcol(mi, 0));
          if (row < w.q_rows) { lse_rows[row] = lse(mi); }
        }
      }
    }
    Tensor rO = make_tensor_like<Element>(acc_o);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) { rO(i) = Element(acc_o(i)); }
    const int buf = iter % kQBuffers;
    Element* o_tile = smem.q.data() + buf * kTileElemsQ;
    Tensor sO = make_tensor(make_smem_ptr(o_tile), typename Traits::SmemLayoutO{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr_copy_o = copy_o.get_thread_slice(tid);
    cute::copy(copy_o, thr_copy_o.retile_S(rO), thr_copy_o.partition_D(sO));
    tma_store_fence();  // the generic-proxy writes of sO, visible to the TMA (async proxy)
    // Named barriers 1..3 are the ping-pong turns; 4..6 one per warpgroup here.
    cutlass::arch::NamedBarrier::sync(128, 4 + consumer);
    if (elected) {
      // The wgmma tile of 64 * kConsumerWGs rows repeats down block_m; warpgroup c owns rows
      // [64c, 64c + 64) of each repeat.
      constexpr int kRepeats = kBlockM / (64 * Traits::kConsumerWGs);
      CUTE_UNROLL
      for (int r = 0; r < kRepeats; ++r) {
        const int row0 = (r * Traits::kConsumerWGs + consumer) * Traits::kStoreRowsO;
        CUTE_UNROLL
        for (int b = 0; b < kBoxes; ++b) {
          SM90_TMA_STORE_4D::copy(&params.tma_o, o_tile + (b * kBlockM + row0) * kBoxCols,
                                  b * kBoxCols, w.m0 + row0, w.head, w.batch);
        }
      }
      tma_store_arrive();
    }
  };
  if constexpr (Traits::kPingPong) {
    if (consumer == Traits::kConsumerWGs - 1) {
      cutlass::arch::NamedBarrier::arrive(2 * 128, 1);  // the first turn is warpgroup 0's
    }
  }

  int kv = 0;  // K/V tiles consumed before the current work tile, over this CTA's work tiles
  reset_row_state();
  if constexpr (!Traits::kIntraWGOverlap) {
    for (int tile = tile_first, iter = 0; tile < tile_count; tile += tile_stride, ++iter) {
      const WorkTile w = work_tile<Traits>(p, tile, m_blocks);
      coord_tid = tid;
      asm volatile("" : "+r"(coord_tid));
      wait_q(iter);
      for (int t = 0; t < w.n_tiles; ++t) {
        issue_qk(kv + t, iter % kQBuffers);
        warpgroup_wait<0>();
        release(smem.k_empty, kv + t);
        softmax(w, w.n_tiles - 1 - t);
        rescale_o();
        convert_p();
        issue_pv(kv + t);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        release(smem.v_empty, kv + t);
        // The previous tile's O store has long been read out of its Q buffer by now.
        if (t == 0 && iter > 0) { free_q_buffer(iter - 1); }
      }
      if (w.n_tiles == 0 && iter > 0) { free_q_buffer(iter - 1); }
      kv += w.n_tiles;
      store_o(w, iter);
      reset_row_state();
    }
  } else {
    // Softmax of key tile t runs while the tensor cores do P V of tile t-1. With ping-pong, one
    // warpgroup's epilogue runs while another's GEMMs do, across work tiles too: the epilogue
    // waits for no other warpgroup.
    //
    // Each work tile's wgmmas are issued, waited for and read inside its own iteration. ptxas
    // serialises every wgmma of the kernel (C7515) when a wgmma's result crosses the back edge
    // of the tile loop, which rules out issuing the next tile's first Q K^T under this tile's
    // epilogue (tried in eight arrangements; `compile` reports such a build).
    for (int tile = tile_first, iter = 0; tile < tile_count; tile += tile_stride, ++iter) {
      const WorkTile w = work_tile<Traits>(p, tile, m_blocks);
      coord_tid = tid;
      asm volatile("" : "+r"(coord_tid));
      const int buf = iter % kQBuffers;
      const int n = w.n_tiles;
      wait_q(iter);
      if (n > 0) {
        my_turn();
        issue_qk(kv, buf);
        pass_turn();
        warpgroup_wait<0>();
        release(smem.k_empty, kv);
        softmax(w, n - 1);
        convert_p();
        for (int t = 1; t < n; ++t) {
          my_turn();
          issue_qk(kv + t, buf);
          issue_pv(kv + t - 1);
          pass_turn();
          warpgroup_wait<1>();  // S(t) is ready; P V(t-1) may still run
          release(smem.k_empty, kv + t);
          softmax(w, n - 1 - t);
          warpgroup_wait<0>();  // P V(t-1) done: O and P may be touched again
          warpgroup_fence_operand(acc_o);
          release(smem.v_empty, kv + t - 1);
          rescale_o();
          convert_p();
          // The previous tile's O store has long been read out of its Q buffer by now.
          if (t == 1 && iter > 0) { free_q_buffer(iter - 1); }
        }
        my_turn();
        issue_pv(kv + n - 1);
        pass_turn();
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        release(smem.v_empty, kv + n - 1);
      }
      if (n <= 1 && iter > 0) { free_q_buffer(iter - 1); }
      kv += n;
      store_o(w, iter);
      reset_row_state();
    }
  }
  if (elected) { tma_store_wait<0>(); }  // shared memory must outlive the last store's reads
}

}  // namespace cute_autotune::sm90

#define CUTE_AUTOTUNE_SM90_ENTRY(TRAITS)                                                       \
  extern "C" __constant__ cute_autotune::LaunchInfo cute_autotune_fwd_info =                  \
      TRAITS::launch_info();                                                                   \
  extern "C" __constant__ int cute_autotune_sm90_persistent = TRAITS::kPersistent ? 1 : 0;      \
  extern "C" __constant__ int cute_autotune_sm90_o_box_rows = TRAITS::kStoreRowsO;             \
  extern "C" __global__ void __launch_bounds__(TRAITS::kNThreads, 1)                           \
      cute_autotune_fwd(const __grid_constant__ cute_autotune::sm90::Sm90FwdParams params) {   \
    extern __shared__ __align__(1024) char smem[];                                             \
    cute_autotune::sm90::fwd_tile<TRAITS>(params, smem);                                       \
  }
