// Grid and block sizes of the CUDA launchers, in plain C++, and the launch policy that the host
// sequences (cuda/*_launch.h) are written against. The grid and shared-memory limits are
// parameters (LaunchLimits), so that a test can give a kernel more work than blocks, or push the
// NMS unwrap onto its global-memory path, with a few inputs.
//
// A launch policy `launch`, the last argument of every host sequence, provides:
//  - launch.limits, a LaunchLimits: the real ones in the real launchers;
//  - launch(grid, block, dynamic_shared_bytes, kernel, args...): kernel<<<...>>>(args...) on the
//    current stream (cuda_launch.h), or the CUDA emulation's run of the same grid in the tests
//    (tests/layers/cuda_emulation/emulated_launch.h);
//  - launch.empty(sizes, options): a buffer whose contents are undefined until a kernel writes
//    them (at::empty on the GPU; garbage under the emulation, so that an element a kernel fails to
//    write shows in the results).
#pragma once

#include <cstddef>
#include <cstdint>

namespace detcore {

// --- nms -----------------------------------------------------------------------------------
constexpr int kBlockBoxes = 64;  // boxes per row/column block: one bit each in a 64-bit word
constexpr int kUnwrapThreads = 256;
constexpr int64_t kMaxGridDim = 65535;  // gridDim.y limit; the mask kernel loops over the rest
// The removed bitmap lives in shared memory while static + dynamic shared memory stay under
// the 48 KiB a launch gets without opting in (2 KiB kept for the kernel's static arrays and the
// 1 KiB that an sm_90 build adds to a kernel's shared memory; tests/layers/
// test_cuda_resource_usage.py checks the sum in the built kernels): up to about 376k boxes.
// Beyond that it lives in global memory.
constexpr int64_t kMaxSharedWords = (48 * 1024 - 2048) / sizeof(unsigned long long);

struct NmsLaunch {
  int64_t col_blocks;             // 64-box blocks, the last one partial
  unsigned int grid_x, grid_y;    // mask kernel: column blocks x row blocks, kBlockBoxes threads
  bool unwrap_in_shared;          // unwrap kernel: one block of kUnwrapThreads threads
  size_t unwrap_shared_bytes;     // its dynamic shared memory (the removed bitmap)
};

constexpr NmsLaunch nms_launch(
    int64_t n, int64_t max_grid_dim = kMaxGridDim, int64_t max_shared_words = kMaxSharedWords) {
  NmsLaunch l{};
  l.col_blocks = (n + kBlockBoxes - 1) / kBlockBoxes;
  const int64_t grid = l.col_blocks < max_grid_dim ? l.col_blocks : max_grid_dim;
  l.grid_x = l.grid_y = static_cast<unsigned int>(grid);
  l.unwrap_in_shared = l.col_blocks <= max_shared_words;
  l.unwrap_shared_bytes =
      l.unwrap_in_shared ? static_cast<size_t>(l.col_blocks) * sizeof(unsigned long long) : 0;
  return l;
}

// batched_nms over more than kNmsBandAbove boxes takes the banded path (nms_band_kernels.cuh):
// a mask of the pairs inside each category only, instead of n x ceil(n / 64) words over all
// categories. torchvision's batched_nms switches to a per-category loop on CUDA at the same size
// (20000 coordinates); below it the single mask is small and needs fewer host syncs.
constexpr int64_t kNmsBandAbove = 5000;

struct NmsBandLaunch {
  unsigned int mask_grid_x, mask_grid_y;  // column blocks of the widest run x row blocks
  unsigned int unwrap_grid;               // a block per run, kUnwrapThreads threads each
  bool unwrap_in_shared;                  // the removed bitmap of the widest run fits
  size_t unwrap_shared_bytes;             // its dynamic shared memory
};

// For `blocks` 64-box row blocks in `runs` runs (categories), the widest `widest_run` blocks.
constexpr NmsBandLaunch nms_band_launch(
    int64_t blocks, int64_t runs, int64_t widest_run, int64_t max_grid_dim = kMaxGridDim,
    int64_t max_shared_words = kMaxSharedWords) {
  NmsBandLaunch l{};
  l.mask_grid_x = static_cast<unsigned int>(widest_run < max_grid_dim ? widest_run : max_grid_dim);
  l.mask_grid_y = static_cast<unsigned int>(blocks < max_grid_dim ? blocks : max_grid_dim);
  l.unwrap_grid = static_cast<unsigned int>(runs < max_grid_dim ? runs : max_grid_dim);
  l.unwrap_in_shared = widest_run <= max_shared_words;
  l.unwrap_shared_bytes =
      l.unwrap_in_shared ? static_cast<size_t>(widest_run) * sizeof(unsigned long long) : 0;
  return l;
}

// --- roi_align ------------------------------------------------------------------------------
constexpr int kRoiAlignThreads = 256;  // one thread per pooled output element
constexpr int64_t kMaxBlocks = 65535;  // grid-stride loops cover the rest

// Blocks for `total` pooled elements (forward) or incoming gradients (backward).
constexpr unsigned int roi_align_blocks(int64_t total, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = (total + kRoiAlignThreads - 1) / kRoiAlignThreads;
  return static_cast<unsigned int>(blocks < max_blocks ? blocks : max_blocks);
}

// --- roi_pool -------------------------------------------------------------------------------
constexpr int kRoiPoolThreads = 256;  // one thread per pooled element or incoming gradient

// Blocks for `total` pooled elements (forward) or incoming gradients (backward); grid-stride
// loops cover what max_blocks leaves.
constexpr unsigned int roi_pool_blocks(int64_t total, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = (total + kRoiPoolThreads - 1) / kRoiPoolThreads;
  return static_cast<unsigned int>(blocks < max_blocks ? blocks : max_blocks);
}

// --- deform_conv2d --------------------------------------------------------------------------
constexpr int kDeformConvThreads = 256;  // one thread per column entry, input channel, or tap

// Blocks for `total` threads' worth of work (im2col, col2im, coordinate gradients).
constexpr unsigned int deform_conv2d_blocks(int64_t total, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = (total + kDeformConvThreads - 1) / kDeformConvThreads;
  return static_cast<unsigned int>(blocks < max_blocks ? blocks : max_blocks);
}

// --- sigmoid_focal_loss ---------------------------------------------------------------------
constexpr int kFocalLossThreads = 256;  // one thread per element; a power of two (tree sums)

// Blocks for n elements; grid-stride loops cover what max_blocks leaves. A function of n alone,
// so that the sum's order (and its bits) is the same on every GPU.
constexpr unsigned int focal_loss_blocks(int64_t n, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = (n + kFocalLossThreads - 1) / kFocalLossThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks < max_blocks ? blocks : max_blocks);
}

// --- the limits a launch policy carries ------------------------------------------------------
struct LaunchLimits {
  int64_t max_blocks = kMaxBlocks;              // 1-D grids (grid-stride loops cover the rest)
  int64_t max_grid_dim = kMaxGridDim;           // each dimension of the NMS grids
  int64_t max_shared_words = kMaxSharedWords;   // the NMS unwrap's removed bitmap in shared memory
  int64_t nms_band_above = kNmsBandAbove;       // batched_nms: the banded path above this many boxes
};

}  // namespace detcore
