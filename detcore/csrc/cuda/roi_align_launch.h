// Host side of the CUDA roi_align and its backward: the buffers, the empty cases, the dtype
// dispatch and the launches of roi_align_kernels.cuh's kernels. Shared by the real launcher
// (roi_align_kernel.cu) and the CUDA emulation of the tests, which pass their launch policy
// (launch_config.h), so that both run exactly this sequence.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include "launch_config.h"
#include "roi_align_kernels.cuh"

namespace detcore {

template <typename Launch>
at::Tensor roi_align_forward_launch(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned, const Launch& launch) {
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  // A map with no pixels has nothing to sample: every bin averages to 0.
  if (height == 0 || width == 0) {
    return at::zeros({num_rois, channels, pooled_height, pooled_width}, input.options());
  }
  at::Tensor output =
      launch.empty({num_rois, channels, pooled_height, pooled_width}, input.options());
  const int64_t total = output.numel();
  if (total == 0) {
    return output;
  }

  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_roi_align_forward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(roi_align_blocks(total, launch.limits.max_blocks)), dim3(kRoiAlignThreads), 0,
            roi_align_forward_kernel<scalar_t, acc_t>, total,
            static_cast<const scalar_t*>(input_c.data_ptr<scalar_t>()),
            static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()),
            static_cast<acc_t>(spatial_scale), input.size(0), channels, height, width,
            pooled_height, pooled_width, sampling_ratio, aligned, output.data_ptr<scalar_t>());
      });
  return output;
}

// The gradients are added into a zeroed buffer of the accumulation type (atomics), returned in
// grad's type.
template <typename Launch>
at::Tensor roi_align_backward_launch(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned, const Launch& launch) {
  const at::ScalarType acc_type = at::toOpMathType(grad.scalar_type());
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_type));
  const int64_t total = grad.numel();
  if (total == 0 || height == 0 || width == 0) {
    return grad_input.to(grad.scalar_type());
  }

  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "detcore_roi_align_backward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        // grad is read through its strides: an expanded grad (out.sum()) is not materialized.
        launch(
            dim3(roi_align_blocks(total, launch.limits.max_blocks)), dim3(kRoiAlignThreads), 0,
            roi_align_backward_kernel<scalar_t, acc_t>, total,
            static_cast<const scalar_t*>(grad.data_ptr<scalar_t>()), grad.stride(0),
            grad.stride(1), grad.stride(2), grad.stride(3),
            static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()),
            static_cast<acc_t>(spatial_scale), batch_size, channels, height, width,
            pooled_height, pooled_width, sampling_ratio, aligned, grad_input.data_ptr<acc_t>());
      });
  // A no-op for float / double (same dtype); one cast for half / bfloat16.
  return grad_input.to(grad.scalar_type());
}

}  // namespace detcore
