// Launchers of roi_align and its backward; the kernels are in roi_align_kernels.cuh, the grid
// in launch_config.h.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>

#include "../checks.h"
#include "../value_checks.h"
#include "launch_config.h"
#include "roi_align_kernels.cuh"

namespace detcore {
namespace {

at::Tensor roi_align_forward_cuda(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  check_roi_align_inputs(
      input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
      value_checks_enabled());
  at::cuda::CUDAGuard device_guard(input.device());

  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  // A map with no pixels has nothing to sample: every bin averages to 0.
  if (height == 0 || width == 0) {
    return at::zeros({num_rois, channels, pooled_height, pooled_width}, input.options());
  }
  at::Tensor output =
      at::empty({num_rois, channels, pooled_height, pooled_width}, input.options());
  const int64_t total = output.numel();
  if (total == 0) {
    return output;
  }

  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_roi_align_forward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        roi_align_forward_kernel<scalar_t, acc_t>
            <<<roi_align_blocks(total), kRoiAlignThreads, 0, stream>>>(
                total, input_c.data_ptr<scalar_t>(), rois_c.data_ptr<scalar_t>(),
                static_cast<acc_t>(spatial_scale), input.size(0), channels, height, width,
                pooled_height, pooled_width, sampling_ratio, aligned, output.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return output;
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

  const at::ScalarType acc_type = at::toOpMathType(grad.scalar_type());
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_type));
  const int64_t total = grad.numel();
  if (total == 0 || height == 0 || width == 0) {
    return grad_input.to(grad.scalar_type());
  }

  const at::Tensor rois_c = rois.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "detcore_roi_align_backward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        roi_align_backward_kernel<scalar_t, acc_t>
            <<<roi_align_blocks(total), kRoiAlignThreads, 0, stream>>>(
                total, grad.data_ptr<scalar_t>(), grad.stride(0), grad.stride(1), grad.stride(2),
                grad.stride(3), rois_c.data_ptr<scalar_t>(), static_cast<acc_t>(spatial_scale),
                batch_size, channels, height, width, pooled_height, pooled_width, sampling_ratio,
                aligned, grad_input.data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  // A no-op for float / double (same dtype); one cast for half / bfloat16.
  return grad_input.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_cuda));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_cuda));
}

}  // namespace detcore
