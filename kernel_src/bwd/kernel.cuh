// FlashAttention backward, one CTA per (key tile, KV head, batch): bwd_tile is the main
// kernel's device code; preprocess and postprocess are the entries before and after it
// (params.h says what each computes). The macro at the end defines the three __global__
// entries and the LaunchInfo, once per generated translation unit.
//
// Per query tile i of each query head of the group (P, dP, dS of the tile, seen transposed
// because warps tile the key rows; base-2 exponentials with the LSE of the forward):
//   S^T  = K Q_i^T                 P^T = exp2(S^T * scale_log2 - LSE_log2)
//   dP^T = V dO_i^T                dS^T = P^T * (dP^T - dPsum)
//   dV  += P^T dO_i                dK  += dS^T Q_i           (registers, over the whole loop)
//   dQ_i += dS K                   (fp32 atomics into the workspace; scaled in postprocess)
// and at the end dK *= scale. Contract as the forward's: any Lq, Lk >= 1, causal aligned
// bottom-right, strided rows/heads/batches, GQA/MQA through head_ratio. A query row that sees
// no key (causal, Lq > Lk) gets dQ = 0 and adds nothing to dK, dV.
#pragma once

#include <cute/tensor.hpp>

#include "../common/launch_info.h"
#include "../common/layout.h"
#include "../common/sm80_mma.h"
#include "params.h"
#include "traits.cuh"

namespace cute_autotune::bwd {

using namespace cute;

// A (rows, D) view of one head of a [B, H, L, D] tensor.
template <int kHeadDim, typename Element>
__forceinline__ __device__ auto head_rows(Element* base, int64_t batch_stride, int64_t head_stride,
                                          int64_t row_stride, int batch, int head, int rows) {
  return make_tensor(make_gmem_ptr(base + batch * batch_stride + head * head_stride),
                     make_shape(rows, Int<kHeadDim>{}), make_stride(row_stride, _1{}));
}

// The counter protocol of the deterministic mode: acquire and release at GPU scope.
__forceinline__ __device__ int load_acquire(const int* address) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

__forceinline__ __device__ void store_release(int* address, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" : : "l"(address), "r"(value) : "memory");
}

template <typename Traits>
__forceinline__ __device__ void bwd_tile(BwdParams const& p, char* smem) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr bool kCausal = Traits::kCausal;
  constexpr int kSliceD = Traits::kSliceD;

  const int tid = threadIdx.x;
  const int n_block = blockIdx.x / Traits::kDSlices;
  const int d_slice = blockIdx.x % Traits::kDSlices;
  const int d0 = d_slice * kSliceD;  // this CTA's columns of dK, dV and dQ
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const int n0 = n_block * kBlockN;
  const int key_rows = min(kBlockN, p.seqlen_k - n0);
  // Query row i sees key j iff j <= i + diagonal (causal) and j < Lk.
  const int diagonal = p.seqlen_k - p.seqlen_q;
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  // The first query tile with a row that sees a key of this tile; the last query row sees
  // every key, so at least one tile remains.
  const int m_first = kCausal ? max(0, n0 - diagonal) / kBlockM : 0;
  const int m_count = m_blocks - m_first;
  const int steps = p.head_ratio * m_count;  // (head of the group, query tile) pairs

  Tensor mK = head_rows<kHeadDim>(static_cast<Element const*>(p.k), p.k_batch_stride,
                                  p.k_head_stride, p.k_row_stride, batch, kv_head, p.seqlen_k);
  Tensor mV = head_rows<kHeadDim>(static_cast<Element const*>(p.v), p.v_batch_stride,
                                  p.v_head_stride, p.v_row_stride, batch, kv_head, p.seqlen_k);
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, 0));
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, 0));

  Tensor sK = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutKV{});                         // (BN,D)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});   // (BN,D)
  Tensor sQ = make_tensor(sV.data() + size(sV), typename Traits::SmemLayoutQ{});    // (BM,D,S)
  Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutQ{});   // (BM,D,S)
  Tensor sdS = make_tensor(sdO.data() + size(sdO), typename Traits::SmemLayoutdS{});  // (BM,BN)
  // This CTA's head-dim slice, transposed (traits.cuh: a slice is its base pointer moved).
  Tensor sQt = make_tensor(sQ.data() + d0 * kBlockM, typename Traits::SmemLayoutQt{});   // (DS,BM,S)
  Tensor sdOt = make_tensor(sdO.data() + d0 * kBlockM, typename Traits::SmemLayoutQt{});  // (DS,BM,S)
  Tensor sQtNoSwizzle = make_tensor(sQ.data().get(), typename Traits::SmemLayoutQtNoSwizzle{});
  Tensor sKt = make_tensor(sK.data() + d0 * kBlockN, typename Traits::SmemLayoutKt{});   // (DS,BN)
  Tensor sKtNoSwizzle = make_tensor(sK.data().get(), typename Traits::SmemLayoutKtNoSwizzle{});
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutdSt{});          // (BN,BM)
  // Per slot: the LSE (base 2) of the Q tile's rows, then their dPsum.
  float* sStats = reinterpret_cast<float*>(raw_pointer_cast((sdS.data() + size(sdS)).get()));

  // Global -> shared.
  typename Traits::GmemTiledCopy copy_in;
  auto thr_copy_in = copy_in.get_thread_slice(tid);
  Tensor tKsK = thr_copy_in.partition_D(sK);
  Tensor tVsV = thr_copy_in.partition_D(sV);
  Tensor tQsQ = thr_copy_in.partition_D(sQ);    // (CPY,CPY_M,CPY_D,S)
  Tensor tdOsdO = thr_copy_in.partition_D(sdO);
  Tensor tKVc = thr_copy_in.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  Tensor tQc = thr_copy_in.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));

  // Query tile t of the loop: head kv_head * head_ratio + t / m_count, tile m_first + t % m_count.
  auto head_of = [&](int t) { return kv_head * p.head_ratio + t / m_count; };
  auto m_block_of = [&](int t) { return m_first + t % m_count; };
  auto load_q_do = [&](int t, int slot) {
    const int head = head_of(t);
    const int m_block = m_block_of(t);
    Tensor mQ = head_rows<kHeadDim>(static_cast<Element const*>(p.q), p.q_batch_stride,
                                    p.q_head_stride, p.q_row_stride, batch, head, p.seqlen_q);
    Tensor mdO = head_rows<kHeadDim>(static_cast<Element const*>(p.dout), p.do_batch_stride,
                                     p.do_head_stride, p.do_row_stride, batch, head, p.seqlen_q);
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
    Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
    const int valid = p.seqlen_q - m_block * kBlockM;
    copy_rows<true>(copy_in, thr_copy_in.partition_S(gQ), tQsQ(_, _, _, slot), tQc, valid);
    copy_rows<true>(copy_in, thr_copy_in.partition_S(gdO), tdOsdO(_, _, _, slot), tQc, valid);
    // The workspaces hold whole tiles (params.h), so no bounds check.
    const int64_t row_base =
        (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m_block * kBlockM;
    for (int i = tid; i < 2 * kBlockM; i += Traits::kNThreads) {
      const float* src = (i < kBlockM ? p.lse_log2 : p.dpsum - kBlockM) + row_base + i;
      SM80_CP_ASYNC_CACHEALWAYS<float>::copy(*src, sStats[slot * 2 * kBlockM + i]);
    }
  };

  // The key-row tiled MMA: S^T, dP^T, dV, dK.
  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor tSrK = thr_mma.partition_fragment_A(sK);              // (MMA,MMA_N,MMA_D)
  Tensor tSrV = thr_mma.partition_fragment_A(sV);
  Tensor tSrQ = thr_mma.partition_fragment_B(sQ(_, _, _0{}));  // (MMA,MMA_M,MMA_D)
  Tensor tSrdO = thr_mma.partition_fragment_B(sdO(_, _, _0{}));
  Tensor tKVrQt = thr_mma.partition_fragment_B(sQtNoSwizzle);  // (MMA,MMA_D,MMA_M); Q^T and dO^T
  Tensor acc_dk = partition_fragment_C(mma, Shape<Int<kBlockN>, Int<kSliceD>>{});
  Tensor acc_dv = partition_fragment_C(mma, Shape<Int<kBlockN>, Int<kSliceD>>{});
  clear(acc_dk);
  clear(acc_dv);

  auto s2r_copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_thr_copy_a = s2r_copy_a.get_thread_slice(tid);
  Tensor tXsK = s2r_thr_copy_a.partition_S(sK);
  Tensor tXsV = s2r_thr_copy_a.partition_S(sV);
  Tensor tXrK = s2r_thr_copy_a.retile_D(tSrK);
  Tensor tXrV = s2r_thr_copy_a.retile_D(tSrV);
  auto s2r_copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_thr_copy_b = s2r_copy_b.get_thread_slice(tid);
  Tensor tXsQ = s2r_thr_copy_b.partition_S(sQ);  // (CPY,CPY_M,CPY_D,S)
  Tensor tXsdO = s2r_thr_copy_b.partition_S(sdO);
  auto s2r_copy_bt = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma);
  auto s2r_thr_copy_bt = s2r_copy_bt.get_thread_slice(tid);
  Tensor tXsQt = s2r_thr_copy_bt.partition_S(sQt);  // (CPY,CPY_D,CPY_M,S)
  Tensor tXsdOt = s2r_thr_copy_bt.partition_S(sdOt);

  // The query-row tiled MMA of dQ = dS K.
  typename Traits::TiledMmadQ mma_dq;
  auto thr_mma_dq = mma_dq.get_thread_slice(tid);
  Tensor tQrdS = thr_mma_dq.partition_fragment_A(sdS);          // (MMA,MMA_M,MMA_N)
  Tensor tQrKt = thr_mma_dq.partition_fragment_B(sKtNoSwizzle);  // (MMA,MMA_D,MMA_N)
  auto s2r_copy_ds = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
  auto s2r_thr_copy_ds = s2r_copy_ds.get_thread_slice(tid);
  Tensor tXsdS = s2r_thr_copy_ds.partition_S(sdS);
  Tensor tXrdS = s2r_thr_copy_ds.retile_D(tQrdS);
  auto s2r_copy_kt = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
  auto s2r_thr_copy_kt = s2r_copy_kt.get_thread_slice(tid);
  Tensor tXsKt = s2r_thr_copy_kt.partition_S(sKt);  // (CPY,CPY_D,CPY_N)
  Tensor tdQc = thr_mma_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kSliceD>>{}));

  // Coordinates of this thread's S^T values: rows are keys, columns queries.
  Tensor tSc = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  Tensor tSc_rc = rowcol_view(tSc);
  constexpr int kRows = decltype(size<0>(tSc_rc))::value;
  constexpr int kCols = decltype(size<1>(tSc_rc))::value;
  Tensor tdSsdSt = thr_mma.partition_C(sdSt);

  // Prologue: K and V with the first query tile(s), one cp.async group per query tile.
  copy_rows<true>(copy_in, thr_copy_in.partition_S(gK), tKsK, tKVc, key_rows);
  copy_rows<true>(copy_in, thr_copy_in.partition_S(gV), tVsV, tKVc, key_rows);
  load_q_do(0, 0);
  cp_async_fence();

  for (int t = 0; t < steps; ++t) {
    const int slot = kStages == 1 ? 0 : t % kStages;
    cp_async_wait<0>();
    __syncthreads();  // tile t landed for all threads; every warp is done with step t-1
    if constexpr (kStages == 2) {
      if (t + 1 < steps) { load_q_do(t + 1, (t + 1) % kStages); }
      cp_async_fence();
    }
    const int head = head_of(t);
    const int m0 = m_block_of(t) * kBlockM;
    const int64_t row_base = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;

    const float* lse_log2 = sStats + slot * 2 * kBlockM;  // indexed by the tile's query row
    const float* dpsum = lse_log2 + kBlockM;

    // S^T = K Q^T, masked, and P^T in place.
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockN>, Int<kBlockM>>{});
    clear(acc_s);
    gemm_rs(acc_s, tSrK, tSrQ, tXsQ(_, _, _, slot), mma, s2r_copy_b, s2r_thr_copy_b,
            [&](auto k) { cute::copy(s2r_copy_a, tXsK(_, _, k), tXrK(_, _, k)); });
    Tensor s = rowcol_view(acc_s);
    const bool masked = key_rows < kBlockN || (kCausal && n0 + kBlockN - 1 > m0 + diagonal);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int key = get<0>(tSc_rc(r, 0));
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const int query = m0 + get<1>(tSc_rc(r, c));
        const bool hidden =
            masked && (key >= key_rows || (kCausal && n0 + key > query + diagonal));
        // LSE +inf (a row past Lq or seeing no key) gives exp2(-inf) = 0.
        s(r, c) = hidden ? 0.f : exp2f(s(r, c) * p.scale_log2 - lse_log2[get<1>(tSc_rc(r, c))]);
      }
    }

    // dP^T = V dO^T, then dS^T = P^T (dP^T - dPsum) in place.
    Tensor acc_dp = partition_fragment_C(mma, Shape<Int<kBlockN>, Int<kBlockM>>{});
    clear(acc_dp);
    gemm_rs(acc_dp, tSrV, tSrdO, tXsdO(_, _, _, slot), mma, s2r_copy_b, s2r_thr_copy_b,
            [&](auto k) { cute::copy(s2r_copy_a, tXsV(_, _, k), tXrV(_, _, k)); });
    Tensor dp = rowcol_view(acc_dp);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        dp(r, c) = s(r, c) * (dp(r, c) - dpsum[get<1>(tSc_rc(r, c))]);
      }
    }

    // dV += P^T dO and dK += dS^T Q, P^T and dS^T as A operands straight from registers.
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor rdS = convert_fragment<Element>(acc_dp);
    Tensor tCrP = make_tensor(rP.data(), accum_as_operand_a(rP.layout()));
    Tensor tCrdS = make_tensor(rdS.data(), accum_as_operand_a(rdS.layout()));
    gemm_rs(acc_dv, tCrP, tKVrQt, tXsdOt(_, _, _, slot), mma, s2r_copy_bt, s2r_thr_copy_bt,
            [](auto) {});
    gemm_rs(acc_dk, tCrdS, tKVrQt, tXsQt(_, _, _, slot), mma, s2r_copy_bt, s2r_thr_copy_bt,
            [](auto) {});

    // dS into shared memory for dQ = dS K.
    cute::copy(rdS, tdSsdSt);
    __syncthreads();  // dS complete; every warp is done reading Q and dO of this slot
    if constexpr (kStages == 1) {
      if (t + 1 < steps) { load_q_do(t + 1, 0); }
      cp_async_fence();
    }
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kSliceD>>{});
    clear(acc_dq);
    gemm_rs(acc_dq, tQrdS, tQrKt, tXsKt, mma_dq, s2r_copy_kt, s2r_thr_copy_kt,
            [&](auto k) { cute::copy(s2r_copy_ds, tXsdS(_, _, k), tXrdS(_, _, k)); });
    float* dq_rows = p.dq_accum + row_base * kHeadDim + d0;
    int* semaphore = nullptr;
    if constexpr (Traits::kDeterministic) {
      // Every key tile from 0 up to this one adds to this query tile (the causal ones that
      // skip it are the last ones), so the tiles before this one number n_block. A key tile
      // of lower index was dispatched before this CTA: waiting on it cannot deadlock.
      semaphore = p.dq_semaphore +
                  ((int64_t(batch) * p.heads_q + head) * (p.seqlen_q_rounded / kBlockM) +
                   m_block_of(t)) * Traits::kDSlices +
                  d_slice;
      if (tid == 0) {
        while (load_acquire(semaphore) != n_block) {}
      }
      __syncthreads();
    }
    // Reductions at L2 (never a stale L1 line), in a fixed order when deterministic.
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); ++i) {
      atomicAdd(dq_rows + get<0>(tdQc(i)) * kHeadDim + get<1>(tdQc(i)), acc_dq(i));
    }
    if constexpr (Traits::kDeterministic) {
      __threadfence();  // this thread's additions performed before the release below
      __syncthreads();
      if (tid == 0) { store_release(semaphore, n_block + 1); }
    }
  }
  cp_async_wait<0>();

  // Epilogue: dK scaled, dK and dV through shared memory (over K and V) to 16-byte row
  // chunks of global memory, rows inside Lk only.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) { acc_dk(i) *= p.scale; }
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  auto r2s_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomOut{}, mma);
  auto r2s_thr_copy = r2s_copy.get_thread_slice(tid);
  Tensor sdK = make_tensor(sK.data() + d0 * kBlockN, typename Traits::SmemLayoutKVSlice{});
  Tensor sdV = make_tensor(sV.data() + d0 * kBlockN, typename Traits::SmemLayoutKVSlice{});
  __syncthreads();  // every warp is done with K and V
  cute::copy(r2s_copy, r2s_thr_copy.retile_S(rdK), r2s_thr_copy.partition_D(sdK));
  cute::copy(r2s_copy, r2s_thr_copy.retile_S(rdV), r2s_thr_copy.partition_D(sdV));
  __syncthreads();

  Tensor mdK = head_rows<kHeadDim>(static_cast<Element*>(p.dk), p.dk_batch_stride,
                                   p.dk_head_stride, p.dk_row_stride, batch, kv_head, p.seqlen_k);
  Tensor mdV = head_rows<kHeadDim>(static_cast<Element*>(p.dv), p.dv_batch_stride,
                                   p.dv_head_stride, p.dv_row_stride, batch, kv_head, p.seqlen_k);
  Tensor gdK =
      local_tile(mdK, Shape<Int<kBlockN>, Int<kSliceD>>{}, make_coord(n_block, d_slice));
  Tensor gdV =
      local_tile(mdV, Shape<Int<kBlockN>, Int<kSliceD>>{}, make_coord(n_block, d_slice));
  typename Traits::GmemTiledCopyOut copy_out;
  auto thr_copy_out = copy_out.get_thread_slice(tid);
  Tensor tOc = thr_copy_out.partition_D(make_identity_tensor(Shape<Int<kBlockN>, Int<kSliceD>>{}));
  Tensor tdKgdK = thr_copy_out.partition_D(gdK);
  Tensor tdVgdV = thr_copy_out.partition_D(gdV);
  Tensor tdKr = make_tensor<Element>(shape(tdKgdK));
  Tensor tdVr = make_tensor<Element>(shape(tdVgdV));
  cute::copy(copy_out, thr_copy_out.partition_S(sdK), tdKr);
  cute::copy(copy_out, thr_copy_out.partition_S(sdV), tdVr);
  copy_rows<false>(copy_out, tdKr, tdKgdK, tOc, key_rows);
  copy_rows<false>(copy_out, tdVr, tdVgdV, tOc, key_rows);
}

// Preprocess: per (batch, head, row) of the rounded query length, dPsum = rowsum(dO * O) in
// fp32, the LSE in base 2 (+inf where the row sees no key or lies past Lq) and the row of the
// dQ accumulator zeroed. A row is bwd_threads_per_row(D) threads, 8 elements each.
template <typename Traits>
__forceinline__ __device__ void preprocess(BwdParams const& p) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kThreadsPerRow = bwd_threads_per_row(kHeadDim);
  constexpr int kRowsPerBlock = kBwdAuxThreads / kThreadsPerRow;
  static_assert(kThreadsPerRow <= 32 && kBwdAuxThreads % kThreadsPerRow == 0);
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int lane = threadIdx.x % kThreadsPerRow;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q_rounded;
  const bool live = row < rows;  // every thread takes part in the shuffles below
  const int i = live ? int(row % p.seqlen_q_rounded) : 0;
  const int64_t bh = live ? row / p.seqlen_q_rounded : 0;
  const int b = int(bh / p.heads_q);
  const int h = int(bh % p.heads_q);
  const int col = lane * 8;
  float sum = 0.f;
  if (live && i < p.seqlen_q && col < kHeadDim) {
    const Element* o = static_cast<Element const*>(p.o) + b * p.o_batch_stride +
                       h * p.o_head_stride + i * p.o_row_stride + col;
    const Element* d = static_cast<Element const*>(p.dout) + b * p.do_batch_stride +
                       h * p.do_head_stride + i * p.do_row_stride + col;
    cutlass::Array<Element, 8> ov = *reinterpret_cast<cutlass::Array<Element, 8> const*>(o);
    cutlass::Array<Element, 8> dv = *reinterpret_cast<cutlass::Array<Element, 8> const*>(d);
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e) { sum += float(ov[e]) * float(dv[e]); }
  }
  CUTE_UNROLL
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (!live) { return; }
  if (col < kHeadDim) {
    float4* acc = reinterpret_cast<float4*>(p.dq_accum + row * kHeadDim + col);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if constexpr (Traits::kDeterministic) {
    if (lane < Traits::kDSlices && i % Traits::kBlockM == 0) {
      p.dq_semaphore[(bh * (p.seqlen_q_rounded / Traits::kBlockM) + i / Traits::kBlockM) *
                         Traits::kDSlices +
                     lane] = 0;
    }
  }
  if (lane == 0) {
    const float lse = i < p.seqlen_q ? p.lse[bh * p.seqlen_q + i] : -INFINITY;
    p.dpsum[row] = i < p.seqlen_q ? sum : 0.f;
    p.lse_log2[row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
}

// Postprocess: dQ = scale * dq_accum in the input dtype, 8 elements per thread.
template <typename Traits>
__forceinline__ __device__ void postprocess(BwdParams const& p) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kChunks = kHeadDim / 8;
  const int64_t chunk = int64_t(blockIdx.x) * kBwdAuxThreads + threadIdx.x;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  if (chunk >= rows * kChunks) { return; }
  const int64_t row = chunk / kChunks;
  const int col = int(chunk % kChunks) * 8;
  const int i = int(row % p.seqlen_q);
  const int64_t bh = row / p.seqlen_q;
  const int b = int(bh / p.heads_q);
  const int h = int(bh % p.heads_q);
  const float4* acc = reinterpret_cast<const float4*>(
      p.dq_accum + (bh * p.seqlen_q_rounded + i) * kHeadDim + col);
  const float4 lo = acc[0], hi = acc[1];
  const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  cutlass::Array<Element, 8> out;
  CUTE_UNROLL
  for (int e = 0; e < 8; ++e) { out[e] = Element(v[e] * p.scale); }
  *reinterpret_cast<cutlass::Array<Element, 8>*>(static_cast<Element*>(p.dq) +
                                                  b * p.dq_batch_stride + h * p.dq_head_stride +
                                                  i * p.dq_row_stride + col) = out;
}

}  // namespace cute_autotune::bwd

// The three __global__ entries of a generated translation unit and the main kernel's
// LaunchInfo (its abi_version is kBwdAbiVersion).
#define CUTE_AUTOTUNE_BWD_ENTRY(TRAITS)                                                        \
  extern "C" __constant__ cute_autotune::LaunchInfo cute_autotune_bwd_info =                  \
      TRAITS::launch_info();                                                                   \
  extern "C" __global__ void __launch_bounds__(TRAITS::kNThreads, 1)                           \
      cute_autotune_bwd(const __grid_constant__ cute_autotune::BwdParams params) {             \
    extern __shared__ __align__(128) char smem[];                                              \
    cute_autotune::bwd::bwd_tile<TRAITS>(params, smem);                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(cute_autotune::kBwdAuxThreads)                  \
      cute_autotune_bwd_pre(const __grid_constant__ cute_autotune::BwdParams params) {         \
    cute_autotune::bwd::preprocess<TRAITS>(params);                                            \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(cute_autotune::kBwdAuxThreads)                  \
      cute_autotune_bwd_post(const __grid_constant__ cute_autotune::BwdParams params) {        \
    cute_autotune::bwd::postprocess<TRAITS>(params);                                           \
  }
