// The CUDA emulation's launch policy for the host sequences of detcore/csrc/cuda/*_launch.h (the
// interface is described in launch_config.h), so that the emulated ops run the real launchers'
// allocations, grid sizes, empty cases and dtype dispatch:
//  - a launch runs the emulated grid (cuda_emulation.h) and is recorded (read by the tests
//    through torch.ops.detcore_emulated.launches), as is the size of every empty() buffer
//    (torch.ops.detcore_emulated.allocations: the buffers its kernels fill);
//  - empty() returns garbage, as at::empty on the GPU may: NaN for floating types, the bytes 0xA5
//    for integers (negative: an unwritten index reads as "none" rather than sending a later
//    kernel out of bounds), and alternately true and false for bools, so that an element that a
//    kernel fails to write is wrong whatever its right value.
// The limits are the emulated op's arguments (the real ones by default). Test-only.
#pragma once

#include "cuda_emulation.h"  // first: before detcore's headers

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "detcore/csrc/cuda/launch_config.h"

namespace cuda_emulation {

// Appends (grid.x, grid.y, grid.z, block.x, block.y, block.z, dynamic shared bytes) to the list of
// launches (emulated_launch.cpp).
void record_launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes);
// Appends the bytes of a buffer of empty() to the list of allocations (emulated_launch.cpp).
void record_allocation(int64_t bytes);

struct EmulatedLaunch {
  detcore::LaunchLimits limits;

  template <typename Kernel, typename... Args>
  void operator()(
      dim3 grid, dim3 block, size_t dynamic_shared_bytes, Kernel kernel, Args... args) const {
    record_launch(grid, block, dynamic_shared_bytes);
    cuda_emulation::launch(grid, block, dynamic_shared_bytes, kernel, args...);
  }

  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) const {
    at::Tensor t = at::empty(sizes, options);
    record_allocation(static_cast<int64_t>(t.nbytes()));
    if (t.is_floating_point()) {
      t.fill_(std::numeric_limits<double>::quiet_NaN());
    } else if (t.scalar_type() == at::kBool) {
      t.copy_(at::arange(t.numel()).remainder(2).eq(0).view(t.sizes()));
    } else {
      std::memset(t.data_ptr(), 0xA5, t.nbytes());
    }
    return t;
  }
};

// The policy of the 1-D grids' kernels, with the grid limit max_blocks.
inline EmulatedLaunch with_max_blocks(int64_t max_blocks) {
  EmulatedLaunch launch;
  launch.limits.max_blocks = max_blocks;
  return launch;
}

}  // namespace cuda_emulation
