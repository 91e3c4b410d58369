// The decode90 family: split-KV decode with GQA packing on Hopper (wgmma, TMA, warp-specialised).
//
// One CTA per (packed-row tile, split, KV head, batch), the decode family's grid (launch_info.h,
// fwd_grid, pack_gqa and split_kv set): row r of a CTA is query (m0 + r) / group of query head
// kv_head * group + (m0 + r) % group, so every K/V tile is read once for the whole group. A
// split covers 1/num_splits of the key tiles. With num_splits > 1 the splits are reduced
// either inside a thread-block cluster of num_splits CTAs (when the launcher asks for one,
// launcher/cluster_combine.h: two splits push each other's rows into the peer's shared memory
// and each reduces its half, reduce_pair; more leave their normalised fp32 O and LSE in their
// own shared memory and the cluster reads them through distributed shared memory; no second
// grid either way) or, in a launch without a cluster, through fp32 partial O and LSE in global
// memory that the decode family's combine entry reduces (the cubin's second entry).
// blockIdx.x = m_block * num_splits + split, so the splits of one tile are one cluster.
//
// The CTA is the sm90 family's: warpgroup 0 produces (one thread issues the TMA loads of K and
// V into a ring of kStages stages on mbarriers), 1-2 consumer warpgroups run S = Q K^T, the
// online softmax and O += P V on wgmma, optionally overlapped (S of tile t beside P V of tile
// t-1). What differs: Q's packed rows are gathered by the consumers with cp.async (they are no
// box of a tensor map), the causal mask maps a row to its query, and O leaves from registers
// to the packed rows' own addresses (or to the fp32 workspace of the split).
//
// KV caches as the decode family reads them: contiguous (rows past Lk zero-filled by TMA), with
// per-sequence lengths into a padded cache, or paged. A paged cache's map is over [num_pages,
// page_size, Hkv, D] and a tile is one box per page it spans (per column box), each at the page
// the block table gives; the producer warp looks up the next tile's pages while this one's
// loads are issued, one lane per page. TMA reads whatever a padded cache or a page holds past a
// sequence's length: those keys' scores are masked, and the consumers zero their V rows before
// P V (a masked P is 0, but 0 x NaN is NaN).
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "../launcher/cluster_combine.h"
#include "../common/launch_info.h"
#include "../common/layout.h"
#include "../common/softmax.h"
#include "../common/tma_params.h"
#include "../decode/decode_kernel.cuh"
#include "../sm90/mainloop.cuh"
#include "traits.cuh"

namespace cute_autotune::decode90 {

using namespace cute;
using cutlass::arch::ClusterBarrier;
using cutlass::arch::ClusterTransactionBarrier;

// What one CTA covers: its packed rows and its split's key tiles.
struct SplitTile {
  int group, m0, q_rows, kv_head, batch, split;
  int seqlen_k;              // this sequence's keys
  int diagonal;              // query i sees keys j <= i + diagonal (causal)
  int mask_from;             // first key column some row of the tile may not see
  int tile_begin, tile_end;  // this split's key tiles

  __forceinline__ __device__ int query(int r) const { return (m0 + r) / group; }
  __forceinline__ __device__ int head(int r) const { return kv_head * group + (m0 + r) % group; }
};

template <typename Traits>
__forceinline__ __device__ SplitTile split_tile(FwdParams const& p) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  SplitTile w;
  w.group = p.head_ratio;
  const int rows_total = p.seqlen_q * w.group;
  w.split = int(blockIdx.x) % p.num_splits;
  w.m0 = (int(blockIdx.x) / p.num_splits) * kBlockM;
  w.q_rows = min(kBlockM, rows_total - w.m0);
  w.kv_head = blockIdx.y;
  w.batch = blockIdx.z;
  w.seqlen_k =
      p.seqlens_k == nullptr ? p.seqlen_k : max(0, min(p.seqlens_k[w.batch], p.seqlen_k));
  w.diagonal = w.seqlen_k - p.seqlen_q;
  int key_end = w.seqlen_k;
  w.mask_from = w.seqlen_k;
  if constexpr (Traits::kCausal) {
    key_end = max(0, min(w.seqlen_k, w.query(w.q_rows - 1) + 1 + w.diagonal));
    w.mask_from = max(0, min(w.seqlen_k, w.query(0) + 1 + w.diagonal));
  }
  const int n_tiles = (key_end + kBlockN - 1) / kBlockN;
  const int per_split = (n_tiles + p.num_splits - 1) / p.num_splits;
  w.tile_begin = min(n_tiles, w.split * per_split);
  w.tile_end = min(n_tiles, w.tile_begin + per_split);
  return w;
}

// The in-cluster combine's partials, over shared memory the main loop no longer needs: O
// (fp32, [kBlockM][kHeadDim], see partial_offset) over the K and V rings, LSE over the Q tile.
template <typename Traits>
__forceinline__ __device__ float* partial_o(typename Traits::SharedStorage& smem) {
  using Storage = typename Traits::SharedStorage;
  static_assert(offsetof(Storage, v) == offsetof(Storage, k) + sizeof(Storage::k),
                "the V ring must follow the K ring for the partial O to span both");
  static_assert(sizeof(Storage::k) + sizeof(Storage::v) >=
                    sizeof(float) * Traits::kBlockM * Traits::kHeadDim,
                "the K and V rings must hold a tile of fp32 O");
  return reinterpret_cast<float*>(smem.k.data());
}

// Where (row r, column c) of the partial O lies: row-major with the 8-column blocks of each row
// XOR-swizzled by the row's low 3 bits. The epilogue stores 8 rows x 8 columns per warp
// instruction (the wgmma accumulator's layout): unswizzled, those 8 rows of a 512-byte stride
// fall on the same banks (8 wavefronts where 2 carry the bytes). The combine reads whole rows,
// so it is conflict-free either way. Pairs and quads of columns stay contiguous.
template <int kHeadDim>
__forceinline__ __device__ int partial_offset(int r, int c) {
  static_assert(kHeadDim >= 64, "the swizzle spans 64 columns");
  return r * kHeadDim + (c ^ ((r & 7) << 3));
}

template <typename Traits>
__forceinline__ __device__ float* partial_lse(typename Traits::SharedStorage& smem) {
  static_assert(sizeof(smem.q) >= sizeof(float) * Traits::kBlockM, "Q tile holds the LSE");
  return reinterpret_cast<float*>(smem.q.data());
}

// Loads from the shared memory of CTA `rank` of this cluster (distributed shared memory).
__forceinline__ __device__ float load_peer(const float* local, uint32_t rank) {
  const uint32_t address = cute::set_block_rank(cute::cast_smem_ptr_to_uint(local), rank);
  float value;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(address) : "memory");
  return value;
}

__forceinline__ __device__ float4 load_peer4(const float* local, uint32_t rank) {
  const uint32_t address = cute::set_block_rank(cute::cast_smem_ptr_to_uint(local), rank);
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// Stores to `address` in the shared memory of another CTA of this cluster (an address that
// cute::set_block_rank mapped there) that complete bytes of its transaction barrier at
// `barrier` (mapped too): st.async, fire and forget, so the sender waits for no round trip.
__forceinline__ __device__ void store_peer(uint32_t address, float value, uint32_t barrier) {
  asm volatile(
      "st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
          address),
      "r"(__float_as_uint(value)), "r"(barrier)
      : "memory");
}

__forceinline__ __device__ void store_peer2(uint32_t address, float x, float y,
                                            uint32_t barrier) {
  asm volatile(
      "st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::
          "r"(address),
      "r"(__float_as_uint(x)), "r"(__float_as_uint(y)), "r"(barrier)
      : "memory");
}

// Two splits in a cluster reduce by exchange, not by a pull: CTA `rank` owns the rows
// [rank * kBlockM / 2, (rank + 1) * kBlockM / 2) of the tile. Once its peer has left the main
// loop (the peer's consumer warpgroups arrive on this CTA's q_empty barrier, which the
// decode90 CTA does not use otherwise), each thread pushes its normalised O and LSE of the
// peer's rows into the peer's shared memory with st.async (O over the peer's K and V rings, LSE
// over its Q tile, as the pulled combine lays them out), which completes the peer's q_full
// barrier; the owner reduces them with its own rows still in registers. One barrier each way
// and no load that waits for a peer, where the pulled combine pays two cluster barriers and a
// round trip of distributed shared memory per item.
template <typename Traits>
__forceinline__ __device__ int pair_rows_owned(SplitTile const& w, uint32_t rank) {
  constexpr int kHalf = Traits::kBlockM / 2;
  const int first = int(rank) * kHalf;
  return max(0, min(first + kHalf, w.q_rows) - first);
}

template <typename Traits>
__forceinline__ __device__ uint32_t pair_bytes_expected(SplitTile const& w, uint32_t rank) {
  return uint32_t(pair_rows_owned<Traits>(w, rank)) * (Traits::kHeadDim + 1) * sizeof(float);
}

// The cluster's splits of one tile reduced by their LSE weights, as the combine entry does: the
// tile's (row, 4 columns) items are dealt over the cluster's consumer threads (a warp takes one
// row's 32 chunks). A row no split saw a key of gets O = 0 and LSE = -inf. Each split leaves
// all its rows (zeros where it saw no key), so the loads need no LSE first: an item's loads are
// issued one item ahead of its arithmetic, which hides the latency of distributed shared memory
// behind the previous item instead of waiting for it twice per item.
template <typename Traits>
__forceinline__ __device__ void combine_in_cluster(FwdParams const& p,
                                                   typename Traits::SharedStorage& smem,
                                                   SplitTile const& w, int tid) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kChunks = kHeadDim / 4;
  constexpr int kThreads = Traits::kConsumerThreads;
  const float* o_local = partial_o<Traits>(smem);
  const float* lse_local = partial_lse<Traits>(smem);
  const int splits = p.num_splits;
  const int items = w.q_rows * kChunks;
  const int stride = splits * kThreads;
  struct Partials {
    float lse[kMaxClusterSplits];
    float4 o[kMaxClusterSplits];
  };
  auto fetch = [&](int item, Partials& f) {
    const int r = item / kChunks;
    const int d = item % kChunks * 4;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      f.lse[s] = s < splits ? load_peer(lse_local + r, uint32_t(s)) : -INFINITY;
      f.o[s] = s < splits ? load_peer4(o_local + partial_offset<kHeadDim>(r, d), uint32_t(s))
                          : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  Partials current, next;
  int item = int(cute::block_rank_in_cluster()) * kThreads + tid;
  if (item < items) { fetch(item, current); }
  for (; item < items; item += stride) {
    if (item + stride < items) { fetch(item + stride, next); }
    const int r = item / kChunks;
    const int d = item % kChunks * 4;
    float m = -INFINITY;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) { m = fmaxf(m, current.lse[s]); }
    float sum = 0.f;
    CUTE_UNROLL
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (current.lse[s] != -INFINITY) { sum += __expf(current.lse[s] - m); }
    }
    const float lse = m == -INFINITY ? -INFINITY : m + __logf(sum);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lse != -INFINITY) {
      CUTE_UNROLL
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        const float weight = current.lse[s] == -INFINITY ? 0.f : __expf(current.lse[s] - lse);
        acc.x += weight * current.o[s].x;
        acc.y += weight * current.o[s].y;
        acc.z += weight * current.o[s].z;
        acc.w += weight * current.o[s].w;
      }
    }
    const int head = w.head(r);
    const int query = w.query(r);
    Element* out = static_cast<Element*>(p.o) + w.batch * p.o_batch_stride +
                   head * p.o_head_stride + query * p.o_row_stride + d;
    cutlass::Array<float, 4> values;
    values[0] = acc.x;
    values[1] = acc.y;
    values[2] = acc.z;
    values[3] = acc.w;
    cutlass::NumericArrayConverter<Element, float, 4> convert;
    *reinterpret_cast<cutlass::Array<Element, 4>*>(out) = convert(values);
    if (d == 0 && p.lse != nullptr) {
      p.lse[(int64_t(w.batch) * p.heads_q + head) * p.seqlen_q + query] = lse;
    }
    current = next;
  }
}

// The two splits' exchange (see pair_rows_owned): push the peer's rows, then reduce this CTA's
// own with what the peer pushed. o_rc and c_rc are the normalised accumulator and its (row,
// column) coordinates as row x column views, lse the rows' LSE.
template <typename Traits, typename TensorO, typename TensorC, typename Stats>
__forceinline__ __device__ void reduce_pair(FwdParams const& p,
                                            typename Traits::SharedStorage& smem,
                                            SplitTile const& w, TensorO const& o_rc,
                                            TensorC const& c_rc, Stats const& lse, uint32_t rank) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHalf = Traits::kBlockM / 2;
  const uint32_t peer = rank ^ 1u;
  float* o_shared = partial_o<Traits>(smem);
  float* lse_shared = partial_lse<Traits>(smem);
  // The peer's copies, mapped once: a CTA's window of the cluster's shared memory is contiguous.
  auto peer_address = [&](const void* local) {
    return cute::set_block_rank(cute::cast_smem_ptr_to_uint(local), peer);
  };
  const uint32_t peer_o = peer_address(o_shared);
  const uint32_t peer_lse = peer_address(lse_shared);
  const uint32_t peer_full = peer_address(&smem.q_full[0]);
  // Pushes first, every one of them, then the reduction: with one consumer warpgroup of 128
  // rows a thread holds rows of both halves, and a thread that waited for its own rows before
  // pushing the peer's would hold the peer back.
  bool peer_free = false;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o_rc); ++mi) {
    const int r = get<0>(c_rc(mi, 0));
    if (r >= w.q_rows || r / kHalf == int(rank)) { continue; }
    if (!peer_free) {
      ClusterBarrier::wait(&smem.q_empty[0], 0);  // the peer's rings and Q are free
      peer_free = true;
    }
    const int at = r - int(peer) * kHalf;
    CUTE_UNROLL
    for (int di = 0; di < size<1>(o_rc); di += 2) {
      const int offset = partial_offset<kHeadDim>(at, get<1>(c_rc(mi, di)));
      store_peer2(peer_o + uint32_t(offset) * sizeof(float), o_rc(mi, di), o_rc(mi, di + 1),
                  peer_full);
    }
    if (get<1>(c_rc(mi, 0)) == 0) {
      store_peer(peer_lse + uint32_t(at) * sizeof(float), lse(mi), peer_full);
    }
  }
  bool received = false;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o_rc); ++mi) {
    const int r = get<0>(c_rc(mi, 0));
    if (r >= w.q_rows || r / kHalf != int(rank)) { continue; }
    if (!received) {
      ClusterTransactionBarrier::wait(&smem.q_full[0], 0);  // every byte the peer pushes here
      received = true;
    }
    const int at = r - int(rank) * kHalf;
    const float own = lse(mi);
    const float other = lse_shared[at];
    const float m = fmaxf(own, other);
    // A row neither split saw a key of: O = 0, LSE = -inf.
    const float total =
        m == -INFINITY ? -INFINITY : m + __logf(__expf(own - m) + __expf(other - m));
    const float own_weight = own == -INFINITY ? 0.f : __expf(own - total);
    const float other_weight = other == -INFINITY ? 0.f : __expf(other - total);
    const int head = w.head(r);
    const int query = w.query(r);
    Element* out = static_cast<Element*>(p.o) + w.batch * p.o_batch_stride +
                   head * p.o_head_stride + query * p.o_row_stride;
    CUTE_UNROLL
    for (int di = 0; di < size<1>(o_rc); di += 2) {
      const int c = get<1>(c_rc(mi, di));
      const float2 pushed =
          *reinterpret_cast<const float2*>(o_shared + partial_offset<kHeadDim>(at, c));
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(own_weight * o_rc(mi, di) + other_weight * pushed.x);
      pair[1] = Element(own_weight * o_rc(mi, di + 1) + other_weight * pushed.y);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(out + c) = pair;
    }
    if (get<1>(c_rc(mi, 0)) == 0 && p.lse != nullptr) {
      p.lse[(int64_t(w.batch) * p.heads_q + head) * p.seqlen_q + query] = total;
    }
  }
  // No CTA leaves before its peer's arrive on its q_empty barrier has landed, even one with
  // no row to push.
  if (!peer_free) { ClusterBarrier::wait(&smem.q_empty[0], 0); }
}

// Producer: warp 0 of warpgroup 0. It issues the K and V tiles of the split, last tile first
// (the tiles that need masking come first, as in every family), tile t into stage
// t % kStages. A tile is one TMA box per column box, or, in a paged cache whose pages are
// shorter than the tile, one per page it spans, each issued by its own lane: lane i looks up
// page i of the next tile while this tile's boxes are issued, so the block table's latency
// stays off the loads' path.
template <typename Traits>
__forceinline__ __device__ void produce(TmaFwdParams const& params,
                                        typename Traits::SharedStorage& smem, SplitTile const& w,
                                        int lane) {
  constexpr int kBlockN = Traits::kBlockN;
  FwdParams const& p = params.base;
  if (lane == 0) {
    cute::prefetch_tma_descriptor(&params.tma_k);
    cute::prefetch_tma_descriptor(&params.tma_v);
  }
  const bool paged = p.block_table != nullptr;
  const int page_rows = 1 << p.page_size_log2;
  const int box_rows = paged ? min(kBlockN, page_rows) : kBlockN;  // the launcher's map box
  const int boxes = kBlockN / box_rows;                              // <= 8: pages of >= 16 rows
  const int* table = paged ? p.block_table + int64_t(w.batch) * p.block_table_stride : nullptr;
  // Where box `lane` of key tile n_block starts: (page, or batch, and the row in it). A box
  // wholly past the sequence reads the tile's first page (its table entry may be anything).
  auto where = [&](int n_block) {
    const int first = n_block * kBlockN;
    if (!paged) { return make_int2(w.batch, first); }
    int key = first + min(lane, boxes - 1) * box_rows;
    key = key < w.seqlen_k ? key : first;
    return make_int2(table[key >> p.page_size_log2], key & (page_rows - 1));
  };
  // Box `lane` of a tile: column box lane % kTmaBoxes of page (or tile) lane / kTmaBoxes. One
  // warp instruction issues a tile's boxes: issued one after another by lane 0, the 32 boxes
  // of a 128-key tile at pages of 16 held decode90 to 82% of its contiguous time (H200).
  static_assert(kBlockN / 16 * Traits::kTmaBoxes <= 32, "a tile's boxes exceed the warp");
  const int box = lane / Traits::kTmaBoxes;
  const int column = lane % Traits::kTmaBoxes;
  auto load = [&](CUtensorMap const* map, uint64_t* full, uint64_t* empty,
                  typename Traits::Element* ring, int2 at, int t) {
    const int stage = t % Traits::kStages;
    if (lane == 0) {
      if (t >= Traits::kStages) {
        ClusterBarrier::wait(&empty[stage], uint32_t(t / Traits::kStages - 1) & 1);
      }
      ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], Traits::kTileBytesKV);
    }
    __syncwarp();  // the other lanes write the stage only once lane 0 has seen it free
    const int page = __shfl_sync(0xffffffffu, at.x, box);
    const int row = __shfl_sync(0xffffffffu, at.y, box);
    if (box < boxes) {
      SM90_TMA_LOAD_4D::copy(
          map, &full[stage], 0,
          ring + ((stage * Traits::kTmaBoxes + column) * kBlockN + box * box_rows) *
                     Traits::kTmaBoxCols,
          column * Traits::kTmaBoxCols, row, w.kv_head, page);
    }
  };
  const int n = w.tile_end - w.tile_begin;
  int2 next = n > 0 ? where(w.tile_end - 1) : make_int2(0, 0);
  for (int t = 0; t < n; ++t) {
    const int2 at = next;
    if (t + 1 < n) { next = where(w.tile_end - 2 - t); }
    load(&params.tma_k, smem.k_full, smem.k_empty, smem.k.data(), at, t);
    load(&params.tma_v, smem.v_full, smem.v_empty, smem.v.data(), at, t);
  }
}

// The V rows of the sequence's last key tile past its length, zeroed before any P V reads
// them: a padded cache or a page holds stale rows there, possibly NaN, which a masked P of 0
// would still carry into O (rows past a contiguous cache's end are TMA's zero fill). That tile
// is the first (stage 0) of the split that holds it. Done once, before the main loop, so the
// loop's registers are not shared with it.
template <typename Traits>
__forceinline__ __device__ void zero_v_rows_past_the_sequence(FwdParams const& p,
                                                              typename Traits::SharedStorage& smem,
                                                              SplitTile const& w, int tid) {
  constexpr int kBlockN = Traits::kBlockN;
  const int valid = w.seqlen_k - (w.tile_end - 1) * kBlockN;
  const bool stale_rows = p.seqlens_k != nullptr || p.block_table != nullptr;
  if (!stale_rows || w.tile_end <= w.tile_begin || valid >= kBlockN) { return; }
  ClusterTransactionBarrier::wait(&smem.v_full[0], 0);
  // A row is one 128-byte line of each column box (TMA's swizzle permutes 16-byte chunks
  // within a line), so whole rows are zeroed without the swizzle.
  constexpr int kLineChunks = Traits::kTmaBoxCols * int(sizeof(typename Traits::Element)) / 16;
  const int first = max(valid, 0);
  uint4* stage0 = reinterpret_cast<uint4*>(smem.v.data());
  for (int c = tid; c < (kBlockN - first) * Traits::kTmaBoxes * kLineChunks;
       c += Traits::kConsumerThreads) {
    const int chunk = c % kLineChunks;
    const int box = c / kLineChunks % Traits::kTmaBoxes;
    const int row = first + c / (kLineChunks * Traits::kTmaBoxes);
    stage0[(box * kBlockN + row) * kLineChunks + chunk] = make_uint4(0, 0, 0, 0);
  }
  cutlass::arch::fence_view_async_shared();  // generic-proxy stores before wgmma reads them
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 3);
}

// The consumer warpgroups: Q gathered, the split's key tiles, then O and LSE out.
template <typename Traits>
__forceinline__ __device__ void consume(TmaFwdParams const& params,
                                        typename Traits::SharedStorage& smem, SplitTile const& w,
                                        int tid, bool pulled, bool paired) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kChunksPerRow = Traits::kChunksPerRow;
  constexpr bool kOverlap = Traits::kIntraWGOverlap;
  FwdParams const& p = params.base;
  const bool elected = tid % 128 == 0;

  // Q: the packed rows from their heads, rows past the problem zero-filled. cp.async writes
  // through the generic proxy; wgmma reads through the async proxy, hence the fence.
  {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutO{});
    const Element* q = static_cast<const Element*>(p.q);
    for (int c = tid; c < kBlockM * kChunksPerRow; c += Traits::kConsumerThreads) {
      const int r = c / kChunksPerRow;
      const int col = c % kChunksPerRow * 8;
      const bool valid = r < w.q_rows;
      const Element* src = valid ? q + w.batch * p.q_batch_stride + w.head(r) * p.q_head_stride +
                                       w.query(r) * p.q_row_stride + col
                                 : q;
      decode::cp_async_16(&sQ(r, col), src, valid);
    }
    cp_async_fence();
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 1);
  }
  zero_v_rows_past_the_sequence<Traits>(p, smem, w, tid);

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  using AccO = decltype(partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using AccS = decltype(partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  constexpr int kRows = decltype(size<0>(accum_rowcol(AccO{}.layout())))::value;
  // A split's keys can all lie past a causal row's diagonal: the causal form handles max -inf.
  OnlineSoftmax<kRows, true, true> softmax;
  softmax.reset();
  AccO acc_o;
  clear(acc_o);
  AccS acc_s;
  auto tOrP = make_tensor<Element>(sm90::gmma_accum_as_a(acc_s.layout()));
  Tensor acc_s_as_a = make_tensor(acc_s.data(), sm90::gmma_accum_as_a(acc_s.layout()));

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA,MMA_M,MMA_K,BUFFER)
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA,MMA_N,MMA_K,STAGE)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA,MMA_N,MMA_K,STAGE)
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  const int n = w.tile_end - w.tile_begin;

  auto issue_qk = [&](int t) {
    ClusterTransactionBarrier::wait(&smem.k_full[t % kStages], uint32_t(t / kStages) & 1);
    warpgroup_fence_operand(acc_s);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tSrQ); ++k) {
      cute::gemm(mma_qk, tSrQ(_, _, k, 0), tSrK(_, _, k, t % kStages), acc_s);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  auto issue_pv = [&](int t) {
    ClusterTransactionBarrier::wait(&smem.v_full[t % kStages], uint32_t(t / kStages) & 1);
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOrP); ++k) {
      cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, t % kStages), acc_o);
    }
    warpgroup_commit_batch();
  };
  auto release = [&](uint64_t* empty, int t) {
    if (elected) { ClusterBarrier::arrive(&empty[t % kStages]); }
  };
  auto retire_pv = [&](int t) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    release(smem.v_empty, t);
  };
  auto convert_p = [&]() {
    CUTE_UNROLL
    for (int i = 0; i < size(tOrP); ++i) { tOrP(i) = Element(acc_s_as_a(i)); }
  };
  // Scores past Lk, or past a packed row's own diagonal, to -inf.
  auto mask = [&](int t) {
    const int n_block = w.tile_end - 1 - t;
    if ((n_block + 1) * kBlockN > w.mask_from) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int col = n_block * kBlockN + get<1>(tScS(i));
        // (A real row's diagonal never passes the sequence's end, and mask_from is that end
        // without the causal mask: no register for the length in the loop.)
        const int limit = Traits::kCausal ? w.query(get<0>(tScS(i))) + 1 + w.diagonal
                                          : w.mask_from;
        if (col >= limit) { acc_s(i) = -INFINITY; }
      }
    }
  };
  // S(t) and its softmax; with kPrevPV, P V(t-1) runs beside S(t) and is retired after.
  auto scores_softmax = [&](int t, auto prev_pv) {
    constexpr bool kPrevPV = decltype(prev_pv)::value;
    issue_qk(t);
    if constexpr (kPrevPV) { issue_pv(t - 1); }
    warpgroup_wait<kPrevPV ? 1 : 0>();
    release(smem.k_empty, t);
    warpgroup_fence_operand(acc_s);
    mask(t);
    softmax.update(acc_s, p.scale_log2);
    if constexpr (kPrevPV) { retire_pv(t - 1); }
  };

  if (n > 0) {
    if constexpr (kOverlap) {
      scores_softmax(0, cute::false_type{});
      convert_p();
    }
    for (int t = kOverlap ? 1 : 0; t < n; ++t) {
      scores_softmax(t, cute::bool_constant<kOverlap>{});
      softmax.rescale_o(acc_o);
      convert_p();
      if constexpr (!kOverlap) {
        issue_pv(t);
        retire_pv(t);
      }
    }
    if constexpr (kOverlap) {
      issue_pv(n - 1);
      retire_pv(n - 1);
    }
  }
  // Two splits in a cluster: this warpgroup is past its last wgmma, so (once every consumer
  // warpgroup of this CTA has said so) the peer may push its rows over the rings and Q. The
  // cluster wait makes the peer's barriers, initialised before its arrive, safe to signal.
  const uint32_t rank = paired ? cute::block_rank_in_cluster() : 0u;
  if (paired) {
    cute::cluster_wait();
    if (elected) { ClusterBarrier::arrive(&smem.q_empty[0], rank ^ 1u, 1u); }
  }

  // O normalised and LSE (a row that saw no key: O = 0, LSE = -inf), straight from the
  // accumulator to the packed rows' addresses: two adjacent columns per store. In a cluster
  // they go to this CTA's shared memory instead, over the rings: every consumer warpgroup must
  // be past its last wgmma first.
  const auto lse = softmax.normalize(acc_o, p.scale);
  float* o_shared = partial_o<Traits>(smem);
  float* lse_shared = partial_lse<Traits>(smem);
  Tensor o_rc = rowcol_view(acc_o);
  Tensor tOcO_rc = rowcol_view(
      thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})));
  if (paired) {
    reduce_pair<Traits>(p, smem, w, o_rc, tOcO_rc, lse, rank);
    return;
  }
  if (pulled) { cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 2); }
  const int64_t rows_all = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(o_rc); ++mi) {
    const int r = get<0>(tOcO_rc(mi, 0));
    if (r >= w.q_rows) { continue; }
    const int head = w.head(r);
    const int query = w.query(r);
    const int64_t row = (int64_t(w.batch) * p.heads_q + head) * p.seqlen_q + query;
    const bool writes_lse = get<1>(tOcO_rc(mi, 0)) == 0;
    if (pulled) {
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o_rc); di += 2) {
        const int c = get<1>(tOcO_rc(mi, di));
        *reinterpret_cast<float2*>(o_shared + partial_offset<kHeadDim>(r, c)) =
            make_float2(o_rc(mi, di), o_rc(mi, di + 1));
      }
      if (writes_lse) { lse_shared[r] = lse(mi); }
    } else if (p.num_splits == 1) {
      Element* out = static_cast<Element*>(p.o) + w.batch * p.o_batch_stride +
                     head * p.o_head_stride + query * p.o_row_stride;
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o_rc); di += 2) {
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(o_rc(mi, di));
        pair[1] = Element(o_rc(mi, di + 1));
        *reinterpret_cast<cutlass::Array<Element, 2>*>(out + get<1>(tOcO_rc(mi, di))) = pair;
      }
      if (writes_lse && p.lse != nullptr) { p.lse[row] = lse(mi); }
    } else {
      const int64_t out_row = w.split * rows_all + row;
      float* out = p.o_partial + out_row * kHeadDim;
      CUTE_UNROLL
      for (int di = 0; di < size<1>(o_rc); di += 2) {
        *reinterpret_cast<float2*>(out + get<1>(tOcO_rc(mi, di))) =
            make_float2(o_rc(mi, di), o_rc(mi, di + 1));
      }
      if (writes_lse) { p.lse_partial[out_row] = lse(mi); }
    }
  }
}

template <typename Traits>
__forceinline__ __device__ void decode_tile(TmaFwdParams const& params, char* smem_raw) {
  using Storage = typename Traits::SharedStorage;
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The combine (a programmatic dependent launch) may be scheduled once every CTA of this grid
  // has started; it waits for this grid's results itself.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const SplitTile w = split_tile<Traits>(params.base);
  // Launched with a cluster (of num_splits CTAs, the launcher's choice) the splits are reduced
  // here: two by exchange (reduce_pair: one cluster barrier, at the start, whose wait is long
  // past when it is reached), more by the pulled combine (every thread of every CTA takes part
  // in its two cluster barriers).
  const bool clustered = cute::cluster_shape().x > 1;
  const bool paired = clustered && params.base.num_splits == 2;
  if (threadIdx.x == 0) {
    sm90::init_barriers<Traits>(smem);
    if (paired) {
      ClusterTransactionBarrier::arrive_and_expect_tx(
          &smem.q_full[0], pair_bytes_expected<Traits>(w, cute::block_rank_in_cluster()));
    }
  }
  __syncthreads();
  if (paired) { cute::cluster_arrive(); }  // release: this CTA's barriers are initialised

  if (threadIdx.x / 128 == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x < 32) { produce<Traits>(params, smem, w, int(threadIdx.x)); }
    __syncwarp();
    if (paired) {
      cute::cluster_wait();
    } else if (clustered) {
      cute::cluster_arrive();
      cute::cluster_wait();
      cute::cluster_arrive();
      cute::cluster_wait();
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = int(threadIdx.x) - 128;
  consume<Traits>(params, smem, w, tid, clustered && !paired, paired);
  if (clustered && !paired) {
    __syncwarp();            // the cluster barriers are .aligned: whole warps, converged
    cute::cluster_arrive();  // release: this CTA's partials
    cute::cluster_wait();    // acquire: every split's
    combine_in_cluster<Traits>(params.base, smem, w, tid);
    __syncwarp();
    cute::cluster_arrive();  // no CTA leaves while a peer still reads its shared memory
    cute::cluster_wait();
  }
}

}  // namespace cute_autotune::decode90

// The split attention with its LaunchInfo, the in-cluster combine's mark
// (launcher/cluster_combine.h), and the decode family's combine.
// The entry is CUTE_AUTOTUNE_ENTRY's with the traits' CTAs per SM as the launch bounds' minimum.
#define CUTE_AUTOTUNE_DECODE90_ENTRY(TRAITS)                                                   \
  extern "C" __constant__ cute_autotune::LaunchInfo cute_autotune_fwd_info =                  \
      TRAITS::launch_info();                                                                   \
  extern "C" __global__ void __launch_bounds__(TRAITS::kNThreads, TRAITS::kCtasPerSm)          \
      cute_autotune_fwd(const __grid_constant__ cute_autotune::TmaFwdParams params) {          \
    extern __shared__ __align__(1024) char smem[];                                             \
    cute_autotune::decode90::decode_tile<TRAITS>(params, smem);                                \
  }                                                                                            \
  extern "C" __constant__ int cute_autotune_cluster_combine = cute_autotune::kMaxClusterSplits; \
  extern "C" __global__ void __launch_bounds__(32 * cute_autotune::kCombineWarps)             \
      cute_autotune_combine(const __grid_constant__ cute_autotune::FwdParams params) {         \
    cute_autotune::decode::combine_rows<TRAITS>(params);                                      \
  }
