// FlashAttention forward on Hopper: TMA loads on an mbarrier pipeline, S = Q K^T and O += P V on
// wgmma, one producer warpgroup and kConsumerWGs consumer warpgroups (register reallocation by
// setmaxnreg). One CTA per work tile (query tile, query head, batch), the same grid as the sm80
// family; or, with kPersistent, one CTA per SM that walks the work tiles (the launcher sizes the
// grid from the kernel's exported schedule), heaviest causal tiles first.
//
// Same contract as the sm80 family (fwd_params.h): any Lq, Lk >= 1 (TMA zero-fills rows past
// the end; key columns past Lk are masked; stores are guarded), strides through the tensor maps,
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
  constexpr bool kCausal = Traits::kCausal;
  constexpr int kBoxCols = Traits::kTmaBoxCols;
  constexpr int kBoxes = kHeadDim / kBoxCols;

  FwdParams const& p = params.base;
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int diagonal = p.seqlen_k - p.seqlen_q;
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  // Work tiles of this CTA: blockIdx.x, + gridDim.x, ... in the persistent schedule; else one.
  const int tile_count = Traits::kPersistent ? m_blocks * p.heads_q * p.batch : 1;
  const int tile_first = Traits::kPersistent ? int(blockIdx.x) : 0;
  const int tile_stride = Traits::kPersistent ? int(gridDim.x) : 1;

  if (threadIdx.x == 0) {
    ClusterTransactionBarrier::init(&smem.q_full, 1);
    ClusterBarrier::init(&smem.q_empty, Traits::kConsumerWGs);
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
      int kv = 0;  // K/V tiles issued so far, over every work tile of this CTA
      for (int tile = tile_first, iter = 0; tile < tile_count; tile += tile_stride, ++iter) {
        const WorkTile w = work_tile<Traits>(p, tile, m_blocks);
        // The Q tile is refilled once every consumer warpgroup is past its last Q K^T.
        if (iter > 0) { ClusterBarrier::wait(&smem.q_empty, (iter - 1) & 1); }
        ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full, Traits::kTileBytesQ);
        CUTE_UNROLL
        for (int b = 0; b < kBoxes; ++b) {
          SM90_TMA_LOAD_4D::copy(&params.tma_q, &smem.q_full, 0,
                                 smem.q.data() + b * kBlockM * kBoxCols, b * kBoxCols, w.m0,
                                 w.head, w.batch);
        }
        // Key tiles from the last to the first, as in the sm80 family: only the first ones need
        // masks. K/V tile number kv sits in stage kv % kStages; its empty barrier's phase flips
        // per round of the ring.
        for (int t = 0; t < w.n_tiles; ++t, ++kv) {
          const int n_block = w.n_tiles - 1 - t;
          const int stage = kv % kStages;
          const uint32_t round = kv / kStages;
          if (kv >= kStages) { ClusterBarrier::wait(&smem.k_empty[stage], (round - 1) & 1); }
          ClusterTransactionBarrier::arrive_and_expect_tx(&smem.k_full[stage],
                                                          Traits::kTileBytesKV);
          CUTE_UNROLL
          for (int b = 0; b < kBoxes; ++b) {
            SM90_TMA_LOAD_4D::copy(&params.tma_k, &smem.k_full[stage], 0,
                                   smem.k.data() + (stage * kBoxes + b) * kBlockN * kBoxCols,
                                   b * kBoxCols, n_block * kBlockN, w.kv_head, w.batch);
          }
          if (kv >= kStages) { ClusterBarrier::wait(&smem.v_empty[stage], (round - 1) & 1); }
          ClusterTransactionBarrier::arrive_and_expect_tx(&smem.v_full[stage],
                                                          Traits::kTileBytesKV);
          CUTE_UNROLL
          for (int b = 0; b < kBoxes; ++b) {
            SM90_TMA_LOAD_4D::copy(&params.tma_v, &smem.v_full[stage], 0,
                                   smem.v.data() + (stage * kBoxes + b) * kBlockN * kBoxCols,
                                   b * kBoxCols, n_block * kBlockN, w.kv_head, w.batch);
          }
        }
      }
    }
    return;
  }

  // Consumers.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = threadIdx.x - 128;
  const int consumer = tid / 128;
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
  // O is staged in its own tile in the persistent schedule (Q of the next work tile may be
  // loading), else in the Q tile.
  Element* o_staging;
  if constexpr (Traits::kPersistent) {
    o_staging = smem.o.data();
  } else {
    o_staging = smem.q.data();
  }
  Tensor sO = make_tensor(make_smem_ptr(o_staging), typename Traits::SmemLayoutQ{});

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA,MMA_M,MMA_K) descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA,MMA_N,MMA_K,STAGE)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA,MMA_N,MMA_K,STAGE)
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  // The thread index the per-element coordinates (masking, epilogue) are derived from, passed
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

  WorkTile w;
  int kv = 0;  // K/V tiles consumed before the current work tile, over this CTA's work tiles
  auto stage_of = [&](int t) { return (kv + t) % kStages; };
  auto phase_of = [&](int t) { return uint32_t(((kv + t) / kStages) & 1); };

  // Issue S = Q K(t)^T (asynchronous; completes at a warpgroup_wait).
  auto issue_qk = [&](int t) {
    ClusterTransactionBarrier::wait(&smem.k_full[stage_of(t)], phase_of(t));
    warpgroup_fence_operand(acc_s);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tSrQ); ++k) {
      cute::gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k, stage_of(t)), acc_s);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  // Issue O += P V(t) with P in registers (asynchronous).
  auto issue_pv = [&](int t) {
    ClusterTransactionBarrier::wait(&smem.v_full[stage_of(t)], phase_of(t));
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOrP); ++k) {
      cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, stage_of(t)), acc_o);
    }
    warpgroup_commit_batch();
  };
  // One arrival per consumer warpgroup frees a stage for the producer.
  auto release = [&](uint64_t* empty, int t) {
    if (tid % 128 == 0) { ClusterBarrier::arrive(&empty[stage_of(t)]); }
  };
  // Mask S(t), fold it into the running max and sum, turn it into exp2 weights, and leave the
  // factor the output must be rescaled by in `rescale` (O itself is not touched here: with the
  // intra-warpgroup overlap a P V wgmma may still be accumulating into it).
  auto softmax = [&](int t) {
    warpgroup_fence_operand(acc_s);
    const int n_block = w.n_tiles - 1 - t;
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
      rescale(mi) = exp2f(prev * p.scale_log2 - max_scaled);
      float sum = 0.f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s_rowcol); ++ni) {
        s_rowcol(mi, ni) = exp2f(s_rowcol(mi, ni) * p.scale_log2 - max_scaled);
        sum += s_rowcol(mi, ni);
      }
      row_sum(mi) = row_sum(mi) * rescale(mi) + sum;
    }
  };
  auto rescale_o = [&]() {
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
  // One arrival per consumer warpgroup once its last Q K^T of the work tile has completed: the
  // producer then loads the next tile's Q while this one finishes its softmax, P V and
  // epilogue (persistent schedule; without one nobody waits on it).
  auto release_q = [&]() {
    if (tid % 128 == 0) { ClusterBarrier::arrive(&smem.q_empty); }
  };
  if constexpr (Traits::kPingPong) {
    if (consumer == Traits::kConsumerWGs - 1) {
      cutlass::arch::NamedBarrier::arrive(2 * 128, 1);  // the first turn is warpgroup 0's
    }
  }

  for (int tile = tile_first, iter = 0; tile < tile_count; tile += tile_stride, ++iter) {
    w = work_tile<Traits>(p, tile, m_blocks);
    coord_tid = tid;
    asm volatile("" : "+r"(coord_tid));
    clear(acc_o);
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
    ClusterTransactionBarrier::wait(&smem.q_full, iter & 1);
    if constexpr (!Traits::kIntraWGOverlap) {
      for (int t = 0; t < w.n_tiles; ++t) {
        issue_qk(t);
        warpgroup_wait<0>();
        release(smem.k_empty, t);
        if (t == w.n_tiles - 1) { release_q(); }
        softmax(t);
        rescale_o();
        convert_p();
        issue_pv(t);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        release(smem.v_empty, t);
      }
    } else if (w.n_tiles > 0) {
      // Softmax of tile t runs while the tensor cores do P V of tile t-1.
      my_turn();
      issue_qk(0);
      pass_turn();
      warpgroup_wait<0>();
      release(smem.k_empty, 0);
      if (w.n_tiles == 1) { release_q(); }
      softmax(0);
      convert_p();
      for (int t = 1; t < w.n_tiles; ++t) {
        my_turn();
        issue_qk(t);
        issue_pv(t - 1);
        pass_turn();
        warpgroup_wait<1>();  // S(t) is ready; P V(t-1) may still run
        release(smem.k_empty, t);
        if (t == w.n_tiles - 1) { release_q(); }
        softmax(t);
        warpgroup_wait<0>();  // P V(t-1) done: O and P may be touched again
        warpgroup_fence_operand(acc_o);
        release(smem.v_empty, t - 1);
        rescale_o();
        convert_p();
      }
      my_turn();
      issue_pv(w.n_tiles - 1);
      pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      release(smem.v_empty, w.n_tiles - 1);
    }
    kv += w.n_tiles;
    if (w.n_tiles == 0) { release_q(); }  // a tile whose rows see no key still used its Q

    // Epilogue: normalise, LSE, then O through shared memory for 16-byte row stores.
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

    Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
    Tensor tOcO = mma_pv.get_thread_slice(coord_tid).partition_C(cO);
    if (p.lse != nullptr) {
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

    if constexpr (Traits::kPersistent) {
      // O goes out by TMA from its own tile and nobody waits for it, except the next work
      // tile's epilogue before it overwrites sO (and the end of the kernel).
      if (tid == 0) { tma_store_wait<0>(); }
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 0);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) { sO(tOcO(i)) = Element(acc_o(i)); }
      tma_store_fence();  // the generic-proxy writes of sO, visible to the TMA (async proxy)
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 0);
      if (tid == 0) {
        CUTE_UNROLL
        for (int b = 0; b < kBoxes; ++b) {
          SM90_TMA_STORE_4D::copy(&params.tma_o, smem.o.data() + b * kBlockM * kBoxCols,
                                  b * kBoxCols, w.m0, w.head, w.batch);
        }
        tma_store_arrive();
      }
      continue;
    }
    // Every consumer must be past its last wgmma reading sQ (sO is the Q tile) before sO is
    // written.
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 0);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) { sO(tOcO(i)) = Element(acc_o(i)); }
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 0);

    // 16-byte chunks of O rows: chunk c of row r holds columns [8c, 8c+8).
    Element* out =
        static_cast<Element*>(p.o) + w.batch * p.o_batch_stride + w.head * p.o_head_stride;
    constexpr int kChunksPerRow = kHeadDim / 8;
    for (int chunk = tid; chunk < kBlockM * kChunksPerRow; chunk += Traits::kConsumerThreads) {
      const int row = chunk / kChunksPerRow;
      const int col = (chunk % kChunksPerRow) * 8;
      if (row < w.q_rows) {
        cute::array<Element, 8> values;
        CUTE_UNROLL
        for (int j = 0; j < 8; ++j) { values[j] = sO(row, col + j); }
        *reinterpret_cast<uint4*>(out + int64_t(w.m0 + row) * p.o_row_stride + col) =
            *reinterpret_cast<uint4 const*>(values.data());
      }
    }
  }
  if constexpr (Traits::kPersistent) {
    if (tid == 0) { tma_store_wait<0>(); }  // sO must outlive the last store's reads
  }
}

}  // namespace cute_autotune::sm90

#define CUTE_AUTOTUNE_SM90_ENTRY(TRAITS)                                                       \
  extern "C" __constant__ cute_autotune::LaunchInfo cute_autotune_fwd_info =                  \
      TRAITS::launch_info();                                                                   \
  extern "C" __constant__ int cute_autotune_sm90_persistent = TRAITS::kPersistent ? 1 : 0;      \
  extern "C" __global__ void __launch_bounds__(TRAITS::kNThreads, 1)                           \
      cute_autotune_fwd(const __grid_constant__ cute_autotune::sm90::Sm90FwdParams params) {   \
    extern __shared__ __align__(1024) char smem[];                                             \
    cute_autotune::sm90::fwd_tile<TRAITS>(params, smem);                                       \
  }
