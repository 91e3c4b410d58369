// Launch parameters of the sm90 family: the shared FwdParams plus the TMA tensor maps the
// launcher encodes for every call (a map holds the tensor's base address). Passed by value as a
// __grid_constant__ kernel parameter, so TMA reads the maps from parameter space.
//
// Every map describes a tensor as 4-D (D, L, H, B) with D contiguous; its box is
// (kTmaBoxCols, rows, 1, 1): one 128-byte swizzle span of columns (64 16-bit values; 32 for
// head_dim 32) by the tile's rows. A tile of head_dim columns takes head_dim / kTmaBoxCols boxes,
// which land side by side in shared memory exactly as the K-major swizzled GMMA layout expects.
#pragma once

#include <cuda.h>

#include "../fwd_params.h"

namespace cute_autotune::sm90 {

struct Sm90FwdParams {
  CUtensorMap tma_q;  // (D, Lq, Hq, B), box rows = block_m
  CUtensorMap tma_k;  // (D, Lk, Hkv, B), box rows = block_n
  CUtensorMap tma_v;  // (D, Lk, Hkv, B), box rows = block_n
  CUtensorMap tma_o;  // (D, Lq, Hq, B), box rows = the kernel's cute_autotune_sm90_o_box_rows
  FwdParams base;
};

}  // namespace cute_autotune::sm90
