// The launcher: one small pybind11 extension that loads cubins through the CUDA driver API and
// launches them on the caller's stream with the params struct shared with the kernels.
//
// No torch types cross this boundary (tensors arrive as device addresses and element strides),
// so the extension builds against any Python/torch. libcuda is opened with dlopen at first use:
// the module imports on machines without a driver and says so when asked to load a kernel.
//
// Work happens in the device's primary context, the one the CUDA runtime (and so torch) uses.
// Grid, block, dynamic shared memory, the schedule and the TMA maps come from the LaunchInfo
// each cubin exports (common/launch_info.h), i.e. from the kernel's own traits: the caller
// reads it from the cubin's ELF symbol (autotune/cubin.py) and passes it in, and loading checks
// it against what the driver reports (the symbol's size, the function's thread limit). Nothing
// here knows a kernel family. Nothing here copies device memory or synchronises, so a
// kernel can even be loaded while a CUDA graph is being captured; cuLaunchKernel is
// asynchronous and capturable.
#include <cuda.h>
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <climits>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cluster_combine.h"
#include "../common/launch_info.h"
#include "../common/tma_params.h"
#include "../bwd/params.h"
#include "../fwd_params.h"

namespace py = pybind11;
using cute_autotune::BwdParams;
using cute_autotune::FwdParams;
using cute_autotune::LaunchInfo;

namespace {

// The driver entry points we use, resolved by their versioned ABI names (the unsuffixed names
// are kept by libcuda for old binaries and take 32-bit pointers).
struct Driver {
  decltype(&::cuInit) init;
  decltype(&::cuGetErrorName) get_error_name;
  decltype(&::cuGetErrorString) get_error_string;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain;
  decltype(&::cuCtxGetCurrent) ctx_get_current;
  decltype(&::cuCtxSetCurrent) ctx_set_current;
  decltype(&::cuModuleLoad) module_load;
  decltype(&::cuModuleGetFunction) module_get_function;
  decltype(&::cuModuleGetGlobal) module_get_global;
  decltype(&::cuFuncSetAttribute) func_set_attribute;
  decltype(&::cuFuncGetAttribute) func_get_attribute;
  decltype(&::cuLaunchKernel) launch_kernel;
  decltype(&::cuLaunchKernelEx) launch_kernel_ex;  // null on drivers before CUDA 12.0
  decltype(&::cuTensorMapEncodeTiled) tensor_map_encode_tiled;
  decltype(&::cuDeviceGetAttribute) device_get_attribute;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor) occupancy_max_blocks;
  decltype(&::cuOccupancyMaxActiveClusters) occupancy_max_clusters;  // null before CUDA 12.0
};

template <typename F>
void resolve(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) {
    throw std::runtime_error(std::string("libcuda has no ") + name + "; the driver is too old");
  }
}

const Driver& driver() {
  static Driver d{};
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      failure = std::string("cannot load the CUDA driver (libcuda.so.1): ") + dlerror() +
                ". cute-autotune runs kernels only on a machine with an NVIDIA GPU and driver.";
      return;
    }
    try {
      resolve(lib, d.init, "cuInit");
      resolve(lib, d.get_error_name, "cuGetErrorName");
      resolve(lib, d.get_error_string, "cuGetErrorString");
      resolve(lib, d.device_get, "cuDeviceGet");
      resolve(lib, d.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
      resolve(lib, d.ctx_get_current, "cuCtxGetCurrent");
      resolve(lib, d.ctx_set_current, "cuCtxSetCurrent");
      resolve(lib, d.module_load, "cuModuleLoad");
      resolve(lib, d.module_get_function, "cuModuleGetFunction");
      resolve(lib, d.module_get_global, "cuModuleGetGlobal_v2");
      resolve(lib, d.func_set_attribute, "cuFuncSetAttribute");
      resolve(lib, d.func_get_attribute, "cuFuncGetAttribute");
      resolve(lib, d.launch_kernel, "cuLaunchKernel");
      d.launch_kernel_ex =
          reinterpret_cast<decltype(d.launch_kernel_ex)>(dlsym(lib, "cuLaunchKernelEx"));
      resolve(lib, d.tensor_map_encode_tiled, "cuTensorMapEncodeTiled");
      resolve(lib, d.device_get_attribute, "cuDeviceGetAttribute");
      resolve(lib, d.occupancy_max_blocks, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
      d.occupancy_max_clusters = reinterpret_cast<decltype(d.occupancy_max_clusters)>(
          dlsym(lib, "cuOccupancyMaxActiveClusters"));
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw std::runtime_error(failure);
  return d;
}

void check(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "";
  driver().get_error_name(status, &name);
  driver().get_error_string(status, &text);
  throw std::runtime_error(std::string(what) + " failed: " + name + " (" + text + ")");
}

// Makes the device's primary context current for a scope and restores the previous one.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx) : ctx_(ctx) {
    check(driver().ctx_get_current(&previous_), "cuCtxGetCurrent");
    if (previous_ != ctx_) check(driver().ctx_set_current(ctx_), "cuCtxSetCurrent");
  }
  ~ScopedContext() {
    if (previous_ != ctx_ && previous_ != nullptr) driver().ctx_set_current(previous_);
  }

 private:
  CUcontext ctx_;
  CUcontext previous_ = nullptr;
};

CUtensorMapSwizzle tma_swizzle(int bytes) {
  switch (bytes) {
    case 128: return CU_TENSOR_MAP_SWIZZLE_128B;
    case 64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case 32: return CU_TENSOR_MAP_SWIZZLE_32B;
    default: return CU_TENSOR_MAP_SWIZZLE_NONE;
  }
}

// A TMA tensor map over a (B, H, L, D) operand seen as 4-D (D, L, H, B), D contiguous, with the
// box (tma_box_cols, box_rows, 1, 1) and the swizzle the kernel's LaunchInfo declares (those of
// its shared-memory layout). Rows past L are zero-filled by the hardware. A paged cache is the
// same with B its pages and L a page's rows.
CUtensorMap encode_tensor_map(const void* base, const FwdParams& p, const LaunchInfo& info,
                              int seqlen, int heads, int64_t row_stride, int64_t head_stride,
                              int64_t batch_stride, int box_rows, int64_t batches = -1) {
  constexpr int kElemBytes = 2;  // fp16 / bf16
  cuuint64_t dims[4] = {cuuint64_t(info.head_dim), cuuint64_t(seqlen), cuuint64_t(heads),
                        cuuint64_t(batches < 0 ? p.batch : batches)};
  cuuint64_t strides[3] = {cuuint64_t(row_stride * kElemBytes),
                           cuuint64_t(head_stride * kElemBytes),
                           cuuint64_t(batch_stride * kElemBytes)};
  cuuint32_t box[4] = {cuuint32_t(info.tma_box_cols), cuuint32_t(box_rows), 1, 1};
  cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  check(driver().tensor_map_encode_tiled(
            &map,
            info.dtype == cute_autotune::kDTypeFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            4, const_cast<void*>(base), dims, strides, box, element_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, tma_swizzle(info.tma_swizzle_bytes),
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled");
  return map;
}

// A prepared launch (see Kernel::plan). The CUfunction stays valid for the process: modules are
// never unloaded.
struct Plan {
  FwdParams params{};
  unsigned grid[3] = {0, 0, 0};
  CUfunction function = nullptr;
  CUfunction combine = nullptr;  // set when params.num_splits > 1
  // Launch the combine as a programmatic dependent of the split kernel (sm_90 and newer): it
  // is scheduled while the split kernel's last CTAs run and waits for their results in-kernel
  // (griddepcontrol.wait), so the launch gap between the two leaves the critical path.
  bool overlap_combine = false;
  // num_splits when the splits are reduced inside a thread-block cluster of that many CTAs
  // (launcher/cluster_combine.h): no workspaces, no combine entry. 0 otherwise.
  unsigned cluster = 0;
  CUcontext ctx = nullptr;
  LaunchInfo info{};
  // Pages of a paged cache (the extent of the K and V maps' outer dimension), 0 otherwise.
  int64_t cache_pages = 0;

  // KV-cache operands (fwd_params.h) are optional: 0 for none. With num_splits > 1 the fp32
  // workspaces o_partial and lse_partial must be given; the combine entry then runs after the
  // main one on the same stream.
  void launch(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
              uintptr_t stream, uintptr_t seqlens_k, uintptr_t block_table, uintptr_t o_partial,
              uintptr_t lse_partial) const {
    FwdParams p = params;
    p.q = reinterpret_cast<const void*>(q);
    p.k = reinterpret_cast<const void*>(k);
    p.v = reinterpret_cast<const void*>(v);
    p.o = reinterpret_cast<void*>(o);
    p.lse = reinterpret_cast<float*>(lse);
    p.seqlens_k = reinterpret_cast<const int*>(seqlens_k);
    p.block_table = reinterpret_cast<const int*>(block_table);
    p.o_partial = reinterpret_cast<float*>(o_partial);
    p.lse_partial = reinterpret_cast<float*>(lse_partial);
    if ((p.block_table != nullptr) != (p.page_size_log2 >= 0)) {
      throw std::invalid_argument("a block table needs a plan made with a page size, and back");
    }
    if (p.page_size_log2 < 0) p.page_size_log2 = 0;
    if (p.num_splits > 1 && cluster == 0 &&
        (p.o_partial == nullptr || p.lse_partial == nullptr)) {
      throw std::invalid_argument("num_splits > 1 needs the o_partial and lse_partial workspaces "
                                  "(this plan reduces the splits with the combine entry)");
    }
    if (info.tma_box_cols == 0) {
      submit(function, grid, info.threads, info.smem_bytes, &p, stream);
    } else {
      // A paged cache: maps over its pages, a box per page where pages are shorter than the
      // kernel's tile (the kernel issues as many, plan() checked the page size).
      const bool paged = p.block_table != nullptr;
      const int page_rows = 1 << p.page_size_log2;
      const int kv_rows = paged ? page_rows : p.seqlen_k;
      const int64_t kv_batches = paged ? cache_pages : -1;
      if (paged && cache_pages < 1) {
        throw std::invalid_argument("a paged cache for a TMA kernel needs its page count");
      }
      // The maps hold the base addresses, so they are encoded for every call (host only, a few
      // microseconds; nothing is copied to the device). Stores through the O map clip rows
      // past Lq.
      cute_autotune::TmaFwdParams tma;
      tma.tma_q = encode_tensor_map(p.q, p, info, p.seqlen_q, p.heads_q, p.q_row_stride,
                                    p.q_head_stride, p.q_batch_stride, info.tma_box_rows_q);
      tma.tma_k = encode_tensor_map(p.k, p, info, kv_rows, p.heads_kv, p.k_row_stride,
                                    p.k_head_stride, p.k_batch_stride,
                                    paged ? std::min(info.tma_box_rows_k, page_rows)
                                          : info.tma_box_rows_k,
                                    kv_batches);
      tma.tma_v = encode_tensor_map(p.v, p, info, kv_rows, p.heads_kv, p.v_row_stride,
                                    p.v_head_stride, p.v_batch_stride,
                                    paged ? std::min(info.tma_box_rows_v, page_rows)
                                          : info.tma_box_rows_v,
                                    kv_batches);
      tma.tma_o = encode_tensor_map(p.o, p, info, p.seqlen_q, p.heads_q, p.o_row_stride,
                                    p.o_head_stride, p.o_batch_stride, info.tma_box_rows_o);
      tma.base = p;
      submit(function, grid, info.threads, info.smem_bytes, &tma, stream, false, cluster);
    }
    if (p.num_splits > 1 && cluster == 0) {
      const unsigned combine_grid[3] = {cute_autotune::combine_grid(p), 1, 1};
      submit(combine, combine_grid, 32 * cute_autotune::kCombineWarps, 0, &p, stream,
             overlap_combine);
    }
  }

 private:
  void submit(CUfunction fn, const unsigned g[3], int threads, int smem, void* kernel_params,
              uintptr_t stream, bool programmatic_dependent = false,
              unsigned cluster_x = 0) const {
    void* args[] = {kernel_params};
    ScopedContext scope(ctx);
    if (!programmatic_dependent && cluster_x == 0) {
      check(driver().launch_kernel(fn, g[0], g[1], g[2], threads, 1, 1, smem,
                                   reinterpret_cast<CUstream>(stream), args, nullptr),
            "cuLaunchKernel");
      return;
    }
    CUlaunchAttribute attribute{};
    if (cluster_x != 0) {
      attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attribute.value.clusterDim.x = cluster_x;
      attribute.value.clusterDim.y = 1;
      attribute.value.clusterDim.z = 1;
    } else {
      attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attribute.value.programmaticStreamSerializationAllowed = 1;
    }
    CUlaunchConfig config{};
    config.gridDimX = g[0];
    config.gridDimY = g[1];
    config.gridDimZ = g[2];
    config.blockDimX = unsigned(threads);
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = unsigned(smem);
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(driver().launch_kernel_ex(&config, fn, args, nullptr), "cuLaunchKernelEx");
  }
};

// Whether `ctas` CTAs in clusters of `splits` (of which `clusters_at_once` are resident at
// once) need no more waves than the same CTAs without clusters (`ctas_at_once` resident):
// Kernel::plan's choice between the in-cluster combine and the combine entry. Pure, so the
// rule is tested without a GPU.
bool clusters_cost_no_wave(int64_t ctas, int splits, int64_t clusters_at_once,
                           int64_t ctas_at_once) {
  if (splits < 2 || ctas < 1 || clusters_at_once < 1 || ctas_at_once < 1) return false;
  const int64_t clusters = (ctas + splits - 1) / splits;
  return (clusters + clusters_at_once - 1) / clusters_at_once <=
         (ctas + ctas_at_once - 1) / ctas_at_once;
}

// LaunchInfo fields in declaration order, as autotune/cubin.py reads them from the ELF.
LaunchInfo unpack_launch_info(const py::tuple& t) {
  constexpr size_t kFields = sizeof(LaunchInfo) / sizeof(int);
  if (t.size() != kFields) {
    throw std::invalid_argument("LaunchInfo needs " + std::to_string(kFields) + " fields");
  }
  LaunchInfo info{};
  int* fields = reinterpret_cast<int*>(&info);
  for (size_t i = 0; i < kFields; ++i) fields[i] = t[i].cast<int>();
  return info;
}

// The cubin's LaunchInfo symbol must have this launcher's struct size, and the LaunchInfo the
// caller read from it the params ABI this launcher speaks (`kind`: which params struct).
void check_launch_info(CUmodule module, const char* symbol, const LaunchInfo& info,
                       int abi_version, const char* kind, const std::string& path) {
  CUdeviceptr info_ptr;
  size_t info_bytes = 0;
  check(driver().module_get_global(&info_ptr, &info_bytes, module, symbol),
        (std::string("cuModuleGetGlobal(") + symbol + ")").c_str());
  if (info_bytes != sizeof(LaunchInfo)) {
    throw std::runtime_error(path + ": LaunchInfo has " + std::to_string(info_bytes) +
                             " bytes, this launcher expects " + std::to_string(sizeof(LaunchInfo)));
  }
  if (info.abi_version != abi_version) {
    throw std::runtime_error(path + ": built for " + kind + " ABI " +
                             std::to_string(info.abi_version) + ", this launcher speaks " +
                             std::to_string(abi_version) + "; rebuild it");
  }
}

// Strides in elements as (batch, head, row).
void unpack_strides(const py::tuple& t, int64_t& batch, int64_t& head, int64_t& row) {
  if (t.size() != 3) throw std::invalid_argument("strides must be (batch, head, row)");
  batch = t[0].cast<int64_t>();
  head = t[1].cast<int64_t>();
  row = t[2].cast<int64_t>();
}

class Kernel {
 public:
  Kernel(const std::string& cubin_path, int device, py::tuple info)
      : path_(cubin_path), device_(device) {
    const Driver& d = driver();
    info_ = unpack_launch_info(info);
    check(d.init(0), "cuInit");
    CUdevice dev;
    check(d.device_get(&dev, device), "cuDeviceGet");
    check(d.primary_ctx_retain(&ctx_, dev), "cuDevicePrimaryCtxRetain");
    ScopedContext scope(ctx_);
    check(d.module_load(&module_, cubin_path.c_str()), "cuModuleLoad");
    check(d.module_get_function(&function_, module_, CUTE_AUTOTUNE_KERNEL_SYMBOL),
          "cuModuleGetFunction(" CUTE_AUTOTUNE_KERNEL_SYMBOL ")");
    if (info_.split_kv != 0) {
      check(d.module_get_function(&combine_, module_, CUTE_AUTOTUNE_COMBINE_SYMBOL),
            "cuModuleGetFunction(" CUTE_AUTOTUNE_COMBINE_SYMBOL ")");
      // The combine entry waits on its primary (griddepcontrol.wait) when built for sm_90 and
      // newer, which a cubin running on such a device is.
      int major = 0;
      check(d.device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
      overlap_combine_ = major >= 9 && d.launch_kernel_ex != nullptr;
      // An optional symbol: cubins that can reduce their splits in a cluster say so.
      CUdeviceptr mark;
      size_t mark_bytes = 0;
      cluster_combine_ =
          major >= 9 && d.launch_kernel_ex != nullptr && d.occupancy_max_clusters != nullptr &&
          d.module_get_global(&mark, &mark_bytes, module_, CUTE_AUTOTUNE_CLUSTER_COMBINE_SYMBOL) ==
              CUDA_SUCCESS;
    }
    check_launch_info(module_, CUTE_AUTOTUNE_INFO_SYMBOL, info_, cute_autotune::kAbiVersion,
                      "params", path_);
    int max_threads = 0;
    check(d.func_get_attribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function_),
          "cuFuncGetAttribute");
    if (max_threads < info_.threads || info_.threads <= 0 || info_.block_m <= 0 ||
        info_.smem_bytes < 0) {
      throw std::runtime_error(path_ + ": kernel allows " + std::to_string(max_threads) +
                               " threads per block, its LaunchInfo asks for " +
                               std::to_string(info_.threads));
    }
    // Above 48 KB a kernel must opt in to dynamic shared memory, once per function.
    if (info_.smem_bytes > 48 * 1024) {
      check(d.func_set_attribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 info_.smem_bytes),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    }
    check_tma_boxes();
    // A persistent kernel walks the work tiles from a grid of as many CTAs as the device holds
    // at once; a kernel that can reduce its splits in a cluster weighs that against the same
    // count (clusters_cost_no_wave).
    for (auto& known : max_clusters_) known.store(-1, std::memory_order_relaxed);
    if (info_.persistent != 0 || cluster_combine_) {
      int per_sm = 0;
      int sm_count = 0;
      check(d.occupancy_max_blocks(&per_sm, function_, info_.threads, info_.smem_bytes),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor");
      check(d.device_get_attribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
      if (per_sm < 1) {
        throw std::runtime_error(path_ + ": no CTA of this kernel fits on an SM");
      }
      if (info_.persistent != 0) resident_ctas_ = unsigned(per_sm) * unsigned(sm_count);
      ctas_at_once_ = int64_t(per_sm) * sm_count;
    }
  }

  // 0 for a kernel with one CTA per work tile; else the grid of the persistent schedule.
  unsigned resident_ctas() const { return resident_ctas_; }

  const LaunchInfo& info() const { return info_; }
  int device() const { return device_; }
  const std::string& path() const { return path_; }

  // A launch plan for one problem: the params struct with everything but the tensor addresses
  // filled in and checked, and the grid. The per-call work is then six integers crossing into
  // C++ and one cuLaunchKernel. Strides are in elements, ([batch, head, row]) of the logical
  // (B, H, L, D) views; validating the tensors themselves is the caller's job (Python knows the
  // torch types), this checks what the kernel was built for.
  Plan plan(py::tuple q_strides, py::tuple k_strides, py::tuple v_strides, py::tuple o_strides,
            int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim,
            int dtype, bool causal, double scale, int num_splits, int page_size,
            int64_t block_table_stride, bool cluster_combine, int64_t cache_pages) const {
    if (head_dim != info_.head_dim || dtype != info_.dtype || int(causal) != info_.causal) {
      throw std::invalid_argument(
          "problem (head_dim=" + std::to_string(head_dim) + ", dtype=" + std::to_string(dtype) +
          ", causal=" + std::to_string(causal) + ") does not match the kernel (head_dim=" +
          std::to_string(info_.head_dim) + ", dtype=" + std::to_string(info_.dtype) +
          ", causal=" + std::to_string(info_.causal) + ")");
    }
    if (batch < 1 || heads_q < 1 || heads_kv < 1 || seqlen_q < 1 || seqlen_k < 1 ||
        heads_q % heads_kv != 0) {
      throw std::invalid_argument("need batch, heads, seqlens >= 1 and heads_q % heads_kv == 0");
    }
    if (!(scale > 0.0) || !std::isfinite(scale)) {
      throw std::invalid_argument("softmax scale must be finite and > 0");
    }
    if (num_splits < 1 || (num_splits > 1 && info_.split_kv == 0) || num_splits > 65535) {
      throw std::invalid_argument("num_splits must be 1, or up to 65535 for a kernel with "
                                  "split-KV; got " + std::to_string(num_splits));
    }
    // A TMA kernel loads a page as boxes that keep its shared-memory swizzle: a page must
    // be whole 8-row swizzle atoms, and the tile whole pages or a part of one.
    const bool tma = info_.tma_box_cols != 0;
    if (page_size != 0 && (info_.split_kv == 0 || page_size < 1 ||
                           (page_size & (page_size - 1)) != 0 || block_table_stride < 1 ||
                           (tma && (page_size < 16 || cache_pages < 1)))) {
      throw std::invalid_argument("paged KV needs a decode kernel, a power-of-two page size (at "
                                  "least 16 rows for a TMA kernel, with the cache's page count) "
                                  "and a block table; got page_size " +
                                  std::to_string(page_size));
    }
    Plan plan;
    FwdParams& p = plan.params;
    unpack_strides(q_strides, p.q_batch_stride, p.q_head_stride, p.q_row_stride);
    unpack_strides(k_strides, p.k_batch_stride, p.k_head_stride, p.k_row_stride);
    unpack_strides(v_strides, p.v_batch_stride, p.v_head_stride, p.v_row_stride);
    unpack_strides(o_strides, p.o_batch_stride, p.o_head_stride, p.o_row_stride);
    p.batch = batch;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.head_ratio = heads_q / heads_kv;
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // * log2(e)
    p.num_splits = num_splits;
    p.block_table_stride = block_table_stride;
    p.page_size_log2 = -1;  // no pages; launch() checks the table against it
    for (int s = 0; page_size != 0 && (1 << s) <= page_size; ++s) p.page_size_log2 = s;
    cute_autotune::fwd_grid(info_, p, resident_ctas_, plan.grid);
    plan.function = function_;
    plan.combine = combine_;
    plan.overlap_combine = overlap_combine_;
    if (cluster_combine && num_splits > 1 && clusters_cost_no_wave(plan.grid, num_splits)) {
      plan.cluster = unsigned(num_splits);
    }
    plan.ctx = ctx_;
    plan.info = info_;
    plan.cache_pages = page_size != 0 ? cache_pages : 0;
    return plan;
  }

 private:
  // A kernel that takes TMA maps must declare boxes the driver can encode (at most 256 per
  // dimension) and a swizzle span its box fits in.
  void check_tma_boxes() const {
    if (info_.tma_box_cols == 0) return;
    const int rows[4] = {info_.tma_box_rows_q, info_.tma_box_rows_k, info_.tma_box_rows_v,
                         info_.tma_box_rows_o};
    const int swizzle = info_.tma_swizzle_bytes;
    bool ok = info_.tma_box_cols > 0 && info_.tma_box_cols <= 256 &&
              info_.head_dim % info_.tma_box_cols == 0 &&
              (swizzle == 0 || ((swizzle == 32 || swizzle == 64 || swizzle == 128) &&
                                info_.tma_box_cols * 2 <= swizzle));
    for (int r : rows) ok = ok && r >= 1 && r <= 256;
    if (!ok) {
      throw std::runtime_error(path_ + ": LaunchInfo declares TMA boxes of " +
                               std::to_string(info_.tma_box_cols) + " columns, rows " +
                               std::to_string(rows[0]) + "/" + std::to_string(rows[1]) + "/" +
                               std::to_string(rows[2]) + "/" + std::to_string(rows[3]) +
                               ", swizzle " + std::to_string(info_.tma_swizzle_bytes) + " bytes");
    }
  }

  // Whether reducing the splits of `grid` in clusters of `splits` CTAs costs no wave: a
  // cluster must fit in one GPC, so fewer CTAs are resident at once in clusters than without
  // (an H200 holds 15 clusters of 8 one-per-SM CTAs, 120 CTAs, against 132). A grid of 16
  // such clusters ran in two waves, 97 us where its 128 CTAs without clusters take one (the
  // combine entry then costs a few us). So the cluster only where the grid's clusters need
  // no more waves than its CTAs would.
  bool clusters_cost_no_wave(const unsigned grid[3], int splits) const {
    return ::clusters_cost_no_wave(int64_t(grid[0]) * grid[1] * grid[2], splits,
                                   max_active_clusters(splits), ctas_at_once_);
  }

  // How many clusters of `splits` CTAs of this kernel can be resident at once (0: none, or a
  // cubin or driver without the in-cluster combine), asked of the driver once per split count.
  int max_active_clusters(int splits) const {
    if (!cluster_combine_ || splits < 2 || splits > cute_autotune::kMaxClusterSplits) {
      return 0;
    }
    std::atomic<int>& known = max_clusters_[splits];
    int at_once = known.load(std::memory_order_relaxed);
    if (at_once < 0) {
      CUlaunchAttribute attribute{};
      attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attribute.value.clusterDim.x = unsigned(splits);
      attribute.value.clusterDim.y = 1;
      attribute.value.clusterDim.z = 1;
      CUlaunchConfig config{};
      config.gridDimX = unsigned(splits);
      config.gridDimY = 1;
      config.gridDimZ = 1;
      config.blockDimX = unsigned(info_.threads);
      config.blockDimY = 1;
      config.blockDimZ = 1;
      config.sharedMemBytes = unsigned(info_.smem_bytes);
      config.attrs = &attribute;
      config.numAttrs = 1;
      int clusters = 0;
      ScopedContext scope(ctx_);
      at_once = driver().occupancy_max_clusters(&clusters, function_, &config) == CUDA_SUCCESS
                    ? std::max(clusters, 0)
                    : 0;
      known.store(at_once, std::memory_order_relaxed);
    }
    return at_once;
  }

  std::string path_;
  int device_;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;  // kept for the life of the process with its Kernel
  CUfunction function_ = nullptr;
  CUfunction combine_ = nullptr;  // the split-KV combine entry, when LaunchInfo says split_kv
  bool overlap_combine_ = false;   // see Plan::overlap_combine
  bool cluster_combine_ = false;   // the cubin can reduce its splits in a cluster (Plan::cluster)
  // max_active_clusters per split count, -1 until asked.
  mutable std::atomic<int> max_clusters_[cute_autotune::kMaxClusterSplits + 1];
  // CTAs of this kernel resident at once without clusters (all SMs); set with cluster_combine_.
  int64_t ctas_at_once_ = 0;
  LaunchInfo info_{};
  unsigned resident_ctas_ = 0;
};

// The backward: a cubin with three entries (bwd/params.h) run in order on one stream. The
// plan holds BwdParams with everything but the addresses filled in and checked; the caller
// (Python) allocates the fp32 workspaces, seqlen_q_rounded rows per (batch, head).
struct BwdPlan {
  BwdParams params{};
  CUfunction main = nullptr, pre = nullptr, post = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned pre_blocks = 1, post_blocks = 1;
  int threads = 0, smem_bytes = 0;
  CUcontext ctx = nullptr;

  void launch(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t dout, uintptr_t dq,
              uintptr_t dk, uintptr_t dv, uintptr_t lse, uintptr_t lse_log2, uintptr_t dpsum,
              uintptr_t dq_accum, uintptr_t stream, uintptr_t dq_semaphore) const {
    BwdParams p = params;
    p.q = reinterpret_cast<const void*>(q);
    p.k = reinterpret_cast<const void*>(k);
    p.v = reinterpret_cast<const void*>(v);
    p.o = reinterpret_cast<const void*>(o);
    p.dout = reinterpret_cast<const void*>(dout);
    p.dq = reinterpret_cast<void*>(dq);
    p.dk = reinterpret_cast<void*>(dk);
    p.dv = reinterpret_cast<void*>(dv);
    p.lse = reinterpret_cast<const float*>(lse);
    p.lse_log2 = reinterpret_cast<float*>(lse_log2);
    p.dpsum = reinterpret_cast<float*>(dpsum);
    p.dq_accum = reinterpret_cast<float*>(dq_accum);
    // Required by a deterministic kernel, which the caller knows from its config.
    p.dq_semaphore = reinterpret_cast<int*>(dq_semaphore);
    const uintptr_t all[] = {q, k, v, o, dout, dq, dk, dv, lse, lse_log2, dpsum, dq_accum};
    for (uintptr_t address : all) {
      if (address == 0) throw std::invalid_argument("backward: every operand is required");
    }
    ScopedContext scope(ctx);
    void* args[] = {&p};
    const CUstream s = reinterpret_cast<CUstream>(stream);
    check(driver().launch_kernel(pre, pre_blocks, 1, 1, cute_autotune::kBwdAuxThreads, 1, 1, 0,
                                 s, args, nullptr),
          "cuLaunchKernel(backward preprocess)");
    check(driver().launch_kernel(main, grid[0], grid[1], grid[2], unsigned(threads), 1, 1,
                                 unsigned(smem_bytes), s, args, nullptr),
          "cuLaunchKernel(backward)");
    check(driver().launch_kernel(post, post_blocks, 1, 1, cute_autotune::kBwdAuxThreads, 1, 1, 0,
                                 s, args, nullptr),
          "cuLaunchKernel(backward postprocess)");
  }
};

#define CUTE_AUTOTUNE_BWD_SYMBOL "cute_autotune_bwd"
#define CUTE_AUTOTUNE_BWD_INFO_SYMBOL "cute_autotune_bwd_info"

class BwdKernel {
 public:
  BwdKernel(const std::string& cubin_path, int device, py::tuple info)
      : path_(cubin_path), device_(device) {
    const Driver& d = driver();
    info_ = unpack_launch_info(info);
    check(d.init(0), "cuInit");
    CUdevice dev;
    check(d.device_get(&dev, device), "cuDeviceGet");
    check(d.primary_ctx_retain(&ctx_, dev), "cuDevicePrimaryCtxRetain");
    ScopedContext scope(ctx_);
    check(d.module_load(&module_, cubin_path.c_str()), "cuModuleLoad");
    check(d.module_get_function(&main_, module_, CUTE_AUTOTUNE_BWD_SYMBOL),
          "cuModuleGetFunction(" CUTE_AUTOTUNE_BWD_SYMBOL ")");
    check(d.module_get_function(&pre_, module_, CUTE_AUTOTUNE_BWD_SYMBOL "_pre"),
          "cuModuleGetFunction(" CUTE_AUTOTUNE_BWD_SYMBOL "_pre)");
    check(d.module_get_function(&post_, module_, CUTE_AUTOTUNE_BWD_SYMBOL "_post"),
          "cuModuleGetFunction(" CUTE_AUTOTUNE_BWD_SYMBOL "_post)");
    check_launch_info(module_, CUTE_AUTOTUNE_BWD_INFO_SYMBOL, info_,
                      cute_autotune::kBwdAbiVersion, "backward", path_);
    int max_threads = 0;
    check(d.func_get_attribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, main_),
          "cuFuncGetAttribute");
    if (max_threads < info_.threads || info_.threads <= 0 || info_.block_m <= 0 ||
        info_.block_n <= 0 || info_.smem_bytes < 0 ||
        cute_autotune::kBwdSeqlenRound % info_.block_m != 0 || info_.head_dim % 8 != 0) {
      throw std::runtime_error(path_ + ": its LaunchInfo does not describe a backward kernel "
                               "this launcher can run");
    }
    if (info_.smem_bytes > 48 * 1024) {
      check(d.func_set_attribute(main_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 info_.smem_bytes),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    }
  }

  const LaunchInfo& info() const { return info_; }

  // Strides in elements, (batch, head, row) of the logical (B, H, L, D) views.
  BwdPlan plan(py::tuple q_strides, py::tuple k_strides, py::tuple v_strides, py::tuple o_strides,
               py::tuple do_strides, py::tuple dq_strides, py::tuple dk_strides,
               py::tuple dv_strides, int batch, int heads_q, int heads_kv, int seqlen_q,
               int seqlen_k, int head_dim, int dtype, bool causal, double scale) const {
    if (head_dim != info_.head_dim || dtype != info_.dtype || int(causal) != info_.causal) {
      throw std::invalid_argument("problem (head_dim=" + std::to_string(head_dim) +
                                  ", dtype=" + std::to_string(dtype) +
                                  ", causal=" + std::to_string(causal) +
                                  ") does not match the backward kernel (head_dim=" +
                                  std::to_string(info_.head_dim) + ", dtype=" +
                                  std::to_string(info_.dtype) + ", causal=" +
                                  std::to_string(info_.causal) + ")");
    }
    if (batch < 1 || heads_q < 1 || heads_kv < 1 || seqlen_q < 1 || seqlen_k < 1 ||
        heads_q % heads_kv != 0) {
      throw std::invalid_argument("need batch, heads, seqlens >= 1 and heads_q % heads_kv == 0");
    }
    if (!(scale > 0.0) || !std::isfinite(scale)) {
      throw std::invalid_argument("softmax scale must be finite and > 0");
    }
    const int64_t rounded = (int64_t(seqlen_q) + cute_autotune::kBwdSeqlenRound - 1) /
                            cute_autotune::kBwdSeqlenRound * cute_autotune::kBwdSeqlenRound;
    if (rounded > INT32_MAX || int64_t(seqlen_k) + info_.block_n > INT32_MAX) {
      throw std::invalid_argument("sequence too long for the backward kernel's 32-bit rows");
    }
    BwdPlan plan;
    BwdParams& p = plan.params;
    unpack_strides(q_strides, p.q_batch_stride, p.q_head_stride, p.q_row_stride);
    unpack_strides(k_strides, p.k_batch_stride, p.k_head_stride, p.k_row_stride);
    unpack_strides(v_strides, p.v_batch_stride, p.v_head_stride, p.v_row_stride);
    unpack_strides(o_strides, p.o_batch_stride, p.o_head_stride, p.o_row_stride);
    unpack_strides(do_strides, p.do_batch_stride, p.do_head_stride, p.do_row_stride);
    unpack_strides(dq_strides, p.dq_batch_stride, p.dq_head_stride, p.dq_row_stride);
    unpack_strides(dk_strides, p.dk_batch_stride, p.dk_head_stride, p.dk_row_stride);
    unpack_strides(dv_strides, p.dv_batch_stride, p.dv_head_stride, p.dv_row_stride);
    p.batch = batch;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.head_ratio = heads_q / heads_kv;
    p.seqlen_q_rounded = int(rounded);
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    // A backward cubin's split_kv: its CTAs per key tile (head-dim slices; params.h).
    cute_autotune::bwd_grid(p, info_.block_n, std::max(info_.split_kv, 1), plan.grid);
    if (plan.grid[1] > 65535 || plan.grid[2] > 65535) {
      throw std::invalid_argument("heads_kv and batch must be at most 65535");
    }
    plan.pre_blocks =
        cute_autotune::bwd_pre_blocks(p, cute_autotune::bwd_threads_per_row(info_.head_dim));
    plan.post_blocks = cute_autotune::bwd_post_blocks(p, info_.head_dim);
    plan.main = main_;
    plan.pre = pre_;
    plan.post = post_;
    plan.threads = info_.threads;
    plan.smem_bytes = info_.smem_bytes;
    plan.ctx = ctx_;
    return plan;
  }

 private:
  std::string path_;
  int device_;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction main_ = nullptr, pre_ = nullptr, post_ = nullptr;
  LaunchInfo info_{};
};

}  // namespace

PYBIND11_MODULE(_cute_autotune_launcher, m) {
  m.doc() = "Loads cute-autotune cubins through the CUDA driver and launches them.";
  m.attr("ABI_VERSION") = cute_autotune::kAbiVersion;
  m.def("clusters_cost_no_wave", &clusters_cost_no_wave, py::arg("ctas"), py::arg("splits"),
        py::arg("clusters_at_once"), py::arg("ctas_at_once"));
  py::class_<Kernel>(m, "Kernel")
      .def(py::init<const std::string&, int, py::tuple>(), py::arg("cubin_path"),
           py::arg("device"), py::arg("launch_info"))
      .def_property_readonly("device", &Kernel::device)
      .def_property_readonly("path", &Kernel::path)
      .def_property_readonly("family", [](const Kernel& k) { return k.info().family; })
      .def_property_readonly("head_dim", [](const Kernel& k) { return k.info().head_dim; })
      .def_property_readonly("dtype", [](const Kernel& k) { return k.info().dtype; })
      .def_property_readonly("causal", [](const Kernel& k) { return k.info().causal != 0; })
      .def_property_readonly("block_m", [](const Kernel& k) { return k.info().block_m; })
      .def_property_readonly("block_n", [](const Kernel& k) { return k.info().block_n; })
      .def_property_readonly("threads", [](const Kernel& k) { return k.info().threads; })
      .def_property_readonly("smem_bytes", [](const Kernel& k) { return k.info().smem_bytes; })
      .def_property_readonly("resident_ctas", &Kernel::resident_ctas)
      .def_property_readonly("pack_gqa", [](const Kernel& k) { return k.info().pack_gqa != 0; })
      .def_property_readonly("split_kv", [](const Kernel& k) { return k.info().split_kv != 0; })
      .def("plan", &Kernel::plan, py::arg("q_strides"), py::arg("k_strides"),
           py::arg("v_strides"), py::arg("o_strides"), py::arg("batch"), py::arg("heads_q"),
           py::arg("heads_kv"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("head_dim"),
           py::arg("dtype"), py::arg("causal"), py::arg("scale"), py::arg("num_splits") = 1,
           py::arg("page_size") = 0, py::arg("block_table_stride") = 0,
           py::arg("cluster_combine") = true, py::arg("cache_pages") = 0);
  py::class_<BwdKernel>(m, "BwdKernel")
      .def(py::init<const std::string&, int, py::tuple>(), py::arg("cubin_path"),
           py::arg("device"), py::arg("launch_info"))
      .def_property_readonly("block_m", [](const BwdKernel& k) { return k.info().block_m; })
      .def_property_readonly("block_n", [](const BwdKernel& k) { return k.info().block_n; })
      .def_property_readonly("head_dim", [](const BwdKernel& k) { return k.info().head_dim; })
      .def_property_readonly("causal", [](const BwdKernel& k) { return k.info().causal != 0; })
      .def("plan", &BwdKernel::plan, py::arg("q_strides"), py::arg("k_strides"),
           py::arg("v_strides"), py::arg("o_strides"), py::arg("do_strides"),
           py::arg("dq_strides"), py::arg("dk_strides"), py::arg("dv_strides"), py::arg("batch"),
           py::arg("heads_q"), py::arg("heads_kv"), py::arg("seqlen_q"), py::arg("seqlen_k"),
           py::arg("head_dim"), py::arg("dtype"), py::arg("causal"), py::arg("scale"));
  py::class_<BwdPlan>(m, "BwdPlan")
      .def_property_readonly("seqlen_q_rounded",
                             [](const BwdPlan& p) { return p.params.seqlen_q_rounded; })
      .def_property_readonly("grid", [](const BwdPlan& p) {
        return py::make_tuple(p.grid[0], p.grid[1], p.grid[2]);
      })
      .def("launch", &BwdPlan::launch, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"),
           py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("lse"),
           py::arg("lse_log2"), py::arg("dpsum"), py::arg("dq_accum"), py::arg("stream"),
           py::arg("dq_semaphore") = 0);
  py::class_<Plan>(m, "Plan")
      .def_property_readonly("cluster", [](const Plan& p) { return p.cluster; })
      .def_property_readonly("grid", [](const Plan& p) {
        return py::make_tuple(p.grid[0], p.grid[1], p.grid[2]);
      })
      .def("launch", &Plan::launch, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"),
           py::arg("lse"), py::arg("stream"), py::arg("seqlens_k") = 0,
           py::arg("block_table") = 0, py::arg("o_partial") = 0, py::arg("lse_partial") = 0);
}
