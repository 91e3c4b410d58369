// The decode family: attention of a few query rows against a long KV cache, split over the keys.
//
// One CTA per (query-row tile, split, head or KV head, batch); blockIdx.x = split * m_blocks +
// m_block (launch_info.h, fwd_grid). With GQA packing (kPackGqa) the CTA's rows are the
// (query, head) pairs of one KV head's group, so every K/V tile is read once for the whole group.
// A split covers 1/num_splits of its sequence's key tiles; with num_splits > 1 it writes fp32
// partial O and LSE and combine_rows reduces them (the second entry of the cubin).
//
// KV caches (fwd_params.h): per-sequence lengths (keys past a sequence's length are never read:
// cp.async zero-fills their rows, so stale or NaN cache slots cannot leak), contiguous or paged
// K/V (rows looked up through the block table). Causal masking aligns a sequence's Lq queries to
// the end of its own keys: query i sees key j iff j <= i + len - Lq.
//
// Inside a CTA the warps split the keys (traits.cuh): warp w runs the online softmax of all
// rows over its slice of each tile; at the end the warps' states merge through shared memory.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "../common/launch_info.h"
#include "../common/layout.h"
#include "../common/sm80_mma.h"
#include "../common/softmax.h"
#include "../fwd_params.h"
#include "traits.cuh"

namespace cute_autotune::decode {

using namespace cute;

// 16 bytes global -> shared, bypassing L1; with `valid` false nothing is read and the 16 bytes
// are zero-filled (`src` must still be a valid address).
__forceinline__ __device__ void cp_async_16(void* dst, const void* src, bool valid) {
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src),
               "r"(bytes));
}

// Where the (query, head) row `row` of a CTA's packed rows lives.
struct RowOf {
  int query, head;
};

template <typename Traits>
__forceinline__ __device__ void decode_tile(FwdParams const& p, char* smem) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kWarpN = Traits::kWarpN;
  constexpr int kNWarps = Traits::kNWarps;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kChunksPerRow = Traits::kChunksPerRow;
  constexpr bool kCausal = Traits::kCausal;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The combine (a programmatic dependent launch, launcher.cpp) may be scheduled once every
  // CTA of this grid has started; it waits for this grid's results itself.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif

  // The work tile.
  const int group = Traits::kPackGqa ? p.head_ratio : 1;
  const int rows_total = p.seqlen_q * group;
  const int m_blocks = (rows_total + kBlockM - 1) / kBlockM;
  const int split = int(blockIdx.x) / m_blocks;
  const int m0 = (int(blockIdx.x) % m_blocks) * kBlockM;
  const int q_rows = min(kBlockM, rows_total - m0);
  const int batch = blockIdx.z;
  const int kv_head = Traits::kPackGqa ? int(blockIdx.y) : int(blockIdx.y) / p.head_ratio;
  const int head0 = Traits::kPackGqa ? int(blockIdx.y) * group : int(blockIdx.y);
  auto row_of = [&](int r) { return RowOf{(m0 + r) / group, head0 + (m0 + r) % group}; };

  // This sequence's keys, the ones any row of the tile sees, and this split's share of them.
  const int seqlen_k =
      p.seqlens_k == nullptr ? p.seqlen_k : max(0, min(p.seqlens_k[batch], p.seqlen_k));
  const int diagonal = seqlen_k - p.seqlen_q;  // query i sees keys j <= i + diagonal
  int key_end = seqlen_k;
  int mask_from = seqlen_k;  // first key column some row of the tile may not see
  if constexpr (kCausal) {
    key_end = max(0, min(seqlen_k, (m0 + q_rows - 1) / group + 1 + diagonal));
    mask_from = max(0, min(seqlen_k, m0 / group + 1 + diagonal));
  }
  const int n_tiles = (key_end + kBlockN - 1) / kBlockN;
  const int per_split = (n_tiles + p.num_splits - 1) / p.num_splits;
  const int tile_begin = min(n_tiles, split * per_split);
  const int tile_end = min(n_tiles, tile_begin + per_split);
  const int my_tiles = tile_end - tile_begin;

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});                       // (BM,D)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (WN,D,SLOT)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});  // (WN,D,SLOT)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});            // (D,WN,SLOT)
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});

  // Q: the tile's rows gathered from their heads; rows past the problem are zero.
  const Element* q = static_cast<const Element*>(p.q);
  for (int c = tid; c < kBlockM * kChunksPerRow; c += kNThreads) {
    const int r = c / kChunksPerRow;
    const int col = c % kChunksPerRow * 8;
    const RowOf at = row_of(r);
    const bool valid = r < q_rows;
    const Element* src = valid ? q + batch * p.q_batch_stride + at.head * p.q_head_stride +
                                     at.query * p.q_row_stride + col
                               : q;
    cp_async_16(&sQ(r, col), src, valid);
  }

  // K/V rows: contiguous per (batch, KV head), or paged through the block table.
  const Element* k = static_cast<const Element*>(p.k) + kv_head * p.k_head_stride;
  const Element* v = static_cast<const Element*>(p.v) + kv_head * p.v_head_stride;
  const int* pages = p.block_table + (p.block_table == nullptr ? 0 : batch * p.block_table_stride);
  const int page_mask = (1 << p.page_size_log2) - 1;
  // Each thread's 16-byte column is fixed when the threads tile whole rows (every head dim but
  // 96), and its rows of a tile are kRowsPerThread consecutive ones (a power of two, starting at
  // a multiple of it): a contiguous cache needs one address per tile and an add per row, and a
  // paged cache one block-table lookup per tile, since pages (a power of two of at least
  // kRowsPerThread rows) never split a thread's rows. The lookup is fetched a tile ahead so its
  // latency never stalls the issue of a tile's copies; pages shorter than a thread's rows are
  // looked up again where one starts. (v3 strided a thread's rows over the tile and held one
  // page number per row across the tile's compute.)
  constexpr bool kFixedColumn = kNThreads % kChunksPerRow == 0;
  constexpr int kRowsPerThread = kFixedColumn ? kBlockN * kChunksPerRow / kNThreads : 1;
  static_assert((kRowsPerThread & (kRowsPerThread - 1)) == 0, "rows per thread: a power of two");
  const int my_col = tid % kChunksPerRow * 8;
  const int my_row0 = tid / kChunksPerRow * kRowsPerThread;
  const bool paged = p.block_table != nullptr;
  // Pages shorter than a thread's rows of a tile: a page starts inside them.
  const bool page_inside_rows = paged && (1 << p.page_size_log2) < kRowsPerThread;
  int next_page = 0;  // the page of this thread's first row in the next tile it loads (paged)
  auto fetch_page = [&](int n_block) {
    const int j = n_block * kBlockN + my_row0;
    next_page = j < seqlen_k ? __ldg(pages + (j >> p.page_size_log2)) : 0;
  };
  auto load_kv_fixed_column = [&](int n_block, int stage) {
    const int j0 = n_block * kBlockN + my_row0;
    const Element* k_row;
    const Element* v_row;
    if (paged) {
      const int64_t page = next_page;
      const int in_page = j0 & page_mask;
      k_row = k + page * p.k_batch_stride + int64_t(in_page) * p.k_row_stride + my_col;
      v_row = v + page * p.v_batch_stride + int64_t(in_page) * p.v_row_stride + my_col;
    } else {
      k_row = k + batch * p.k_batch_stride + int64_t(j0) * p.k_row_stride + my_col;
      v_row = v + batch * p.v_batch_stride + int64_t(j0) * p.v_row_stride + my_col;
    }
    CUTE_UNROLL
    for (int it = 0; it < kRowsPerThread; ++it) {
      const int r = my_row0 + it;
      const int j = j0 + it;
      const bool valid = j < seqlen_k;
      if (it > 0 && page_inside_rows && (j & page_mask) == 0) {
        const int64_t page = valid ? __ldg(pages + (j >> p.page_size_log2)) : 0;
        k_row = k + page * p.k_batch_stride + my_col;
        v_row = v + page * p.v_batch_stride + my_col;
      }
      const int slot = stage * kNWarps + r / kWarpN;
      cp_async_16(&sK(r % kWarpN, my_col, slot), valid ? k_row : k, valid);
      cp_async_16(&sV(r % kWarpN, my_col, slot), valid ? v_row : v, valid);
      k_row += p.k_row_stride;
      v_row += p.v_row_stride;
    }
  };
  auto load_kv = [&](int n_block, int stage) {
    static_assert(kBlockN * kChunksPerRow % kNThreads == 0);
    if constexpr (kFixedColumn) {
      load_kv_fixed_column(n_block, stage);
    } else {
      CUTE_UNROLL
      for (int it = 0; it < kBlockN * kChunksPerRow / kNThreads; ++it) {
        const int c = it * kNThreads + tid;
        const int r = c / kChunksPerRow;
        const int col = c % kChunksPerRow * 8;
        const int j = n_block * kBlockN + r;
        const bool valid = j < seqlen_k;
        int64_t k_off = 0, v_off = 0;
        if (valid) {
          if (paged) {
            const int64_t page = pages[j >> p.page_size_log2];
            const int in_page = j & page_mask;
            k_off = page * p.k_batch_stride + in_page * p.k_row_stride;
            v_off = page * p.v_batch_stride + in_page * p.v_row_stride;
          } else {
            k_off = batch * p.k_batch_stride + j * p.k_row_stride;
            v_off = batch * p.v_batch_stride + j * p.v_row_stride;
          }
        }
        const int slot = stage * kNWarps + r / kWarpN;
        cp_async_16(&sK(r % kWarpN, col, slot), k + k_off + col, valid);
        cp_async_16(&sV(r % kWarpN, col, slot), v + v_off + col, valid);
      }
    }
  };
  // Loads the split's tile of ordinal t (walked from the last key tile back) into `stage`, then
  // fetches the page of the tile after it.
  auto issue_tile = [&](int t, int stage) {
    load_kv(tile_end - 1 - t, stage);
    if constexpr (kFixedColumn) {
      if (paged && t + 1 < my_tiles) { fetch_page(tile_end - 2 - t); }
    }
  };
  if constexpr (kFixedColumn) {
    if (paged && my_tiles > 0) { fetch_page(tile_end - 1); }
  }

  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(lane);
  Tensor tCrQ = thr_mma.partition_fragment_A(sQ);              // (MMA,MMA_M,MMA_D)
  Tensor tCrK = thr_mma.partition_fragment_B(sK(_, _, _0{}));  // (MMA,MMA_N,MMA_D)
  Tensor tCrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);   // (MMA,MMA_D,MMA_N)
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);

  auto s2r_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_thr_copy_q = s2r_copy_q.get_thread_slice(lane);
  Tensor tXsQ = s2r_thr_copy_q.partition_S(sQ);
  Tensor tXrQ = s2r_thr_copy_q.retile_D(tCrQ);
  auto s2r_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_thr_copy_k = s2r_copy_k.get_thread_slice(lane);
  Tensor tXsK = s2r_thr_copy_k.partition_S(sK);  // (CPY,CPY_N,CPY_D,SLOT)
  auto s2r_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma);
  auto s2r_thr_copy_v = s2r_copy_v.get_thread_slice(lane);
  Tensor tXsVt = s2r_thr_copy_v.partition_S(sVt);  // (CPY,CPY_D,CPY_N,SLOT)
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kWarpN>>{}));

  // A warp's slice of a tile can lie wholly past the sequence or the diagonal, so rows may
  // see no key yet: the causal form of the softmax handles a max of -inf.
  constexpr int kRows = decltype(size<1>(acc_o))::value * 2;
  OnlineSoftmax<kRows, true, false> softmax;
  softmax.reset();

  auto attend = [&](int n_block, int slot) {
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kWarpN>>{});
    clear(acc_s);
    gemm_rs(acc_s, tCrQ, tCrK, tXsK(_, _, _, slot), mma, s2r_copy_k, s2r_thr_copy_k,
            [&](auto kk) { cute::copy(s2r_copy_q, tXsQ(_, _, kk), tXrQ(_, _, kk)); });
    if ((n_block + 1) * kBlockN > mask_from) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int col = n_block * kBlockN + warp * kWarpN + get<1>(tScS(i));
        const int query = (m0 + get<0>(tScS(i))) / group;
        const int limit = kCausal ? min(seqlen_k, query + 1 + diagonal) : seqlen_k;
        if (col >= limit) { acc_s(i) = -INFINITY; }
      }
    }
    softmax.update(acc_s, p.scale_log2);
    softmax.rescale_o(acc_o);
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tCrP = make_tensor(rP.data(), accum_as_operand_a(rP.layout()));
    gemm_rs(acc_o, tCrP, tCrVt, tXsVt(_, _, _, slot), mma, s2r_copy_v, s2r_thr_copy_v,
            [](auto) {});
  };

  // A ring of kStages tiles, one cp.async group per tile (Q rides with the first), walked from
  // the split's last tile to its first: the tiles that need masking come first.
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_tiles) { issue_tile(s, s); }
    cp_async_fence();
  }
  for (int t = 0; t < my_tiles; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t landed for all threads; every warp is done with tile t-1
    const int t_next = t + kStages - 1;
    if (t_next < my_tiles) { issue_tile(t_next, t_next % kStages); }
    cp_async_fence();
    attend(tile_end - 1 - t, t % kStages * kNWarps + warp);
  }
  cp_async_wait<0>();
  __syncthreads();  // the K/V ring is free: the merge below reuses it

  // Merge the warps: each warp's row max and row sum, then O scaled to the common max and
  // normalised, summed warp by warp in a fixed order (deterministic) in fp32 shared memory.
  float* sO = reinterpret_cast<float*>(smem + Traits::kSmemQBytes);  // (BM, D)
  float* sMax = sO + kBlockM * kHeadDim;                               // (NW, BM)
  float* sSum = sMax + kNWarps * kBlockM;                              // (NW, BM)
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tOcO_rc = rowcol_view(tOcO);
  Tensor o_rc = rowcol_view(acc_o);
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    float sum = softmax.row_sum(mi);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (get<1>(tOcO_rc(mi, 0)) == 0) {
      const int row = get<0>(tOcO_rc(mi, 0));
      sMax[warp * kBlockM + row] = softmax.row_max(mi);
      sSum[warp * kBlockM + row] = sum;
    }
  }
  __syncthreads();
  // The merged state of a row: max M, sum L; a warp's share is scaled by exp2((m_w - M) * s) / L.
  auto merged = [&](int row, float& m, float& l) {
    m = -INFINITY;
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) { m = fmaxf(m, sMax[w * kBlockM + row]); }
    l = 0.f;
    if (m == -INFINITY) { return; }
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) {
      const float mw = sMax[w * kBlockM + row];
      if (mw != -INFINITY) { l += sSum[w * kBlockM + row] * exp2f((mw - m) * p.scale_log2); }
    }
  };
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int row = get<0>(tOcO_rc(mi, 0));
    float m, l;
    merged(row, m, l);
    const float mine = softmax.row_max(mi);
    const float factor =
        (l > 0.f && mine != -INFINITY) ? exp2f((mine - m) * p.scale_log2) / l : 0.f;
    CUTE_UNROLL
    for (int di = 0; di < size<1>(o_rc); ++di) { o_rc(mi, di) *= factor; }
  }
  for (int w = 0; w < kNWarps; ++w) {
    if (warp == w) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) {
        float& slot = sO[get<0>(tOcO(i)) * kHeadDim + get<1>(tOcO(i))];
        slot = (w == 0 ? 0.f : slot) + acc_o(i);
      }
    }
    __syncthreads();
  }

  // Out: the final O (num_splits == 1) in the caller's dtype and layout, or this split's fp32
  // share into the workspace; 8 columns per thread and step.
  const int64_t rows_all = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  for (int c = tid; c < q_rows * kChunksPerRow; c += kNThreads) {
    const int r = c / kChunksPerRow;
    const int col = c % kChunksPerRow * 8;
    const RowOf at = row_of(r);
    const float* src = sO + r * kHeadDim + col;
    if (p.num_splits == 1) {
      cutlass::Array<float, 8> values;
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) { values[e] = src[e]; }
      cutlass::NumericArrayConverter<Element, float, 8> convert;
      Element* dst = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                     at.head * p.o_head_stride + at.query * p.o_row_stride + col;
      *reinterpret_cast<cutlass::Array<Element, 8>*>(dst) = convert(values);
    } else {
      const int64_t out_row =
          split * rows_all + (int64_t(batch) * p.heads_q + at.head) * p.seqlen_q + at.query;
      float4* dst = reinterpret_cast<float4*>(p.o_partial + out_row * kHeadDim + col);
      dst[0] = make_float4(src[0], src[1], src[2], src[3]);
      dst[1] = make_float4(src[4], src[5], src[6], src[7]);
    }
  }
  for (int r = tid; r < q_rows; r += kNThreads) {
    float m, l;
    merged(r, m, l);
    const float lse = l > 0.f ? m * p.scale + __logf(l) : -INFINITY;
    const RowOf at = row_of(r);
    const int64_t row = (int64_t(batch) * p.heads_q + at.head) * p.seqlen_q + at.query;
    if (p.num_splits > 1) {
      p.lse_partial[split * rows_all + row] = lse;
    } else if (p.lse != nullptr) {
      p.lse[row] = lse;
    }
  }
}

// The combine entry: one warp per (batch, head, query) row reduces the splits' normalised fp32
// O by their LSE weights. A row no split saw a key of gets O = 0 and LSE = -inf.
template <typename Traits>
__forceinline__ __device__ void combine_rows(FwdParams const& p) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the split kernel on sm_90 and newer: wait until
  // that grid has finished and its partial O and LSE are visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const int64_t row = int64_t(blockIdx.x) * kCombineWarps + warp;
  if (row >= rows) { return; }
  const float* lse_of = p.lse_partial + row;  // split s at lse_of[s * rows]

  float m = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) { m = fmaxf(m, lse_of[s * rows]); }
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int s = lane; s < p.num_splits; s += 32) {
      const float l = lse_of[s * rows];
      if (l != -INFINITY) { sum += __expf(l - m); }
    }
  }
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  const float lse = m == -INFINITY ? -INFINITY : m + __logf(sum);

  const int query = int(row % p.seqlen_q);
  const int head = int(row / p.seqlen_q % p.heads_q);
  const int batch = int(row / p.seqlen_q / p.heads_q);
  Element* out = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                 head * p.o_head_stride + query * p.o_row_stride;
  // The splits' partial rows are independent loads: issue kBatch of them before the first add,
  // so a row costs about num_splits / kBatch L2 round trips instead of num_splits.
  constexpr int kBatch = 8;
  for (int d = lane * 4; d < kHeadDim; d += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; lse != -INFINITY && s0 < p.num_splits; s0 += kBatch) {
      float weight[kBatch];
      float4 o[kBatch];
      CUTE_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        const int s = s0 + i;
        const float l = s < p.num_splits ? lse_of[s * rows] : -INFINITY;
        weight[i] = l == -INFINITY ? 0.f : __expf(l - lse);
        // Every split writes its rows (zeros where it saw no key), so the load needs no LSE.
        o[i] = s < p.num_splits ? *reinterpret_cast<const float4*>(
                                      p.o_partial + (s * rows + row) * kHeadDim + d)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      CUTE_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        if (weight[i] == 0.f) { continue; }
        acc.x += weight[i] * o[i].x;
        acc.y += weight[i] * o[i].y;
        acc.z += weight[i] * o[i].z;
        acc.w += weight[i] * o[i].w;
      }
    }
    cutlass::Array<float, 4> values;
    values[0] = acc.x;
    values[1] = acc.y;
    values[2] = acc.z;
    values[3] = acc.w;
    cutlass::NumericArrayConverter<Element, float, 4> convert;
    *reinterpret_cast<cutlass::Array<Element, 4>*>(out + d) = convert(values);
  }
  if (lane == 0 && p.lse != nullptr) { p.lse[row] = lse; }
}

}  // namespace cute_autotune::decode

// The two __global__ entries of a generated translation unit: the split attention with its
// LaunchInfo, and the combine.
#define CUTE_AUTOTUNE_DECODE_ENTRY(TRAITS)                                                     \
  CUTE_AUTOTUNE_ENTRY(TRAITS, cute_autotune::FwdParams, 128,                                  \
                      cute_autotune::decode::decode_tile<TRAITS>)                              \
  extern "C" __global__ void __launch_bounds__(32 * cute_autotune::kCombineWarps)             \
      cute_autotune_combine(const __grid_constant__ cute_autotune::FwdParams params) {         \
    cute_autotune::decode::combine_rows<TRAITS>(params);                                      \
  }
