// Launchers of roi_align and its backward: the argument checks, the device, the stream and the
// non-determinism alert; the buffers and launches are roi_align_launch.h's (shared with the CUDA
// emulation of the tests), the kernels roi_align_kernels.cuh's.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>

#include "../checks.h"
#include "../value_checks.h"
#include "cuda_launch.h"
#include "roi_align_launch.h"

namespace detcore {
namespace {

at::Tensor roi_align_forward_cuda(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  check_roi_align_inputs(
      input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
      value_checks_enabled());
  at::cuda::CUDAGuard device_guard(input.device());
  return roi_align_forward_launch(
      input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
      CudaLaunch{});
}

at::Tensor roi_align_backward_cuda(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned) {
  check_roi_align_backward_inputs(
      grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
      width, sampling_ratio, aligned, value_checks_enabled());
  at::cuda::CUDAGuard device_guard(grad.device());
  // The atomics add in whatever order the threads arrive: the float sums vary run to run.
  at::globalContext().alertNotDeterministic("roi_align_backward_cuda");
  return roi_align_backward_launch(
      grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio, aligned, CudaLaunch{});
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_cuda));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_cuda));
}

}  // namespace detcore
