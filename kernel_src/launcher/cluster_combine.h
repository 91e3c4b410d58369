// The in-cluster combine of a split-KV kernel, as its launcher sees it.
//
// A kernel whose cubin exports CUTE_AUTOTUNE_CLUSTER_COMBINE_SYMBOL reduces its KV splits
// itself when it is launched with a thread-block cluster of num_splits CTAs along x (the splits
// of one packed-row tile, blockIdx.x = m_block * num_splits + split): each CTA leaves its
// normalised fp32 O and LSE in its own shared memory, and the cluster reads them through
// distributed shared memory. No workspace, no second grid. Launched without a cluster, the same
// binary writes the fp32 workspaces for the combine entry instead. Plain data only: this header
// compiles in device code and in the host-only launcher.
#pragma once

// The symbol's presence is the whole message (its value is never read: reading it would copy
// device memory, which a load during CUDA-graph capture must not do).
#define CUTE_AUTOTUNE_CLUSTER_COMBINE_SYMBOL "cute_autotune_cluster_combine"

namespace cute_autotune {

// The most CTAs of one cluster the launcher asks for: Hopper's portable size. More splits use
// the combine entry: on the H200 a 16-CTA cluster (the non-portable size) ran slower than 16
// splits through the entry (B1 H32/8 Lq1 Lk8k: 27.2 against 23.2 us; at 8 splits the cluster
// took 19.9 against 22.1; benchmarks/results/decode90_cluster/decode_floor_h200.json).
constexpr int kMaxClusterSplits = 8;

}  // namespace cute_autotune
