// Launchers of roi_pool and its backward: the argument checks, the device, the stream and the
// non-determinism alert; the buffers and launches are roi_pool_launch.h's (shared with the CUDA
// emulation of the tests), the kernels roi_pool_kernels.cuh's.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "../checks.h"
#include "../value_checks.h"
#include "cuda_launch.h"
#include "roi_pool_launch.h"

namespace detcore {
namespace {

std::tuple<at::Tensor, at::Tensor> roi_pool_forward_cuda(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width) {
  check_roi_pool_inputs(
      input, rois, spatial_scale, pooled_height, pooled_width, value_checks_enabled());
  at::cuda::CUDAGuard device_guard(input.device());
  return roi_pool_forward_launch(
      input, rois, spatial_scale, pooled_height, pooled_width, CudaLaunch{});
}

at::Tensor roi_pool_backward_cuda(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    double spatial_scale, int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
    int64_t channels, int64_t height, int64_t width) {
  check_roi_pool_backward_inputs(
      grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels,
      height, width, value_checks_enabled());
  at::cuda::CUDAGuard device_guard(grad.device());
  // The atomics add in whatever order the threads arrive: the float sums vary run to run.
  at::globalContext().alertNotDeterministic("roi_pool_backward_cuda");
  return roi_pool_backward_launch(
      grad, rois, argmax, pooled_height, pooled_width, batch_size, channels, height, width,
      CudaLaunch{});
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("roi_pool", TORCH_FN(roi_pool_forward_cuda));
  m.impl("_roi_pool_backward", TORCH_FN(roi_pool_backward_cuda));
}

}  // namespace detcore
