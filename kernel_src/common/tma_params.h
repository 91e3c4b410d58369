// Launch parameters of a kernel that reads and writes its operands through TMA: the shared
// FwdParams plus one tensor map per operand, which the launcher encodes for every call (a map
// holds the tensor's base address). Passed by value as a __grid_constant__ kernel parameter,
// so TMA reads the maps from parameter space.
//
// Every map describes a tensor as 4-D (D, L, H, B) with D contiguous; its box is
// (LaunchInfo::tma_box_cols, LaunchInfo::tma_box_rows_<operand>, 1, 1), as the kernel's traits
// export them.
#pragma once

#include <cuda.h>

#include "../fwd_params.h"

namespace cute_autotune {

struct TmaFwdParams {
  CUtensorMap tma_q;  // (D, Lq, Hq, B)
  CUtensorMap tma_k;  // (D, Lk, Hkv, B)
  CUtensorMap tma_v;  // (D, Lk, Hkv, B)
  CUtensorMap tma_o;  // (D, Lq, Hq, B)
  FwdParams base;
};

}  // namespace cute_autotune
