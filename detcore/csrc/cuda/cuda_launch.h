// The real launch policy of the host sequences (cuda/*_launch.h; the interface is described in
// launch_config.h): kernels launched on the current stream, buffers from at::empty. Included by
// the launchers (cuda/*.cu) only. Construct it after the device guard: it takes that device's
// current stream.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <cstddef>

#include "launch_config.h"

namespace detcore {

struct CudaLaunch {
  LaunchLimits limits;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  template <typename Kernel, typename... Args>
  void operator()(
      dim3 grid, dim3 block, size_t dynamic_shared_bytes, Kernel kernel, Args... args) const {
    kernel<<<grid, block, dynamic_shared_bytes, stream>>>(args...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) const {
    return at::empty(sizes, options);
  }
};

}  // namespace detcore
