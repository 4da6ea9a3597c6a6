// Host side of the CUDA roi_pool and its backward: the buffers, the empty cases, the dtype
// dispatch and the launches of roi_pool_kernels.cuh's kernels. Shared by the real launcher
// (roi_pool_kernel.cu) and the CUDA emulation of the tests, which pass their launch policy
// (launch_config.h), so that both run exactly this sequence.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <tuple>

#include "launch_config.h"
#include "roi_pool_kernels.cuh"

namespace detcore {

// -> (output, argmax)
template <typename Launch>
std::tuple<at::Tensor, at::Tensor> roi_pool_forward_launch(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, const Launch& launch) {
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  at::Tensor output =
      launch.empty({rois.size(0), channels, pooled_height, pooled_width}, input.options());
  at::Tensor argmax = launch.empty(output.sizes(), input.options().dtype(at::kInt));
  const int64_t total = output.numel();
  if (total == 0) {
    return {output, argmax};
  }

  // Every thread writes its element, also for a map without pixels (empty bins: 0 and -1).
  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_roi_pool_forward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(roi_pool_blocks(total, launch.limits.max_blocks)), dim3(kRoiPoolThreads), 0,
            roi_pool_forward_kernel<scalar_t, acc_t>, total,
            static_cast<const scalar_t*>(input_c.data_ptr<scalar_t>()),
            static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()),
            static_cast<acc_t>(spatial_scale), input.size(0), channels, height, width,
            pooled_height, pooled_width, output.data_ptr<scalar_t>(), argmax.data_ptr<int32_t>());
      });
  return {output, argmax};
}

// The gradients are added into a zeroed buffer of the accumulation type (atomics), returned in
// grad's type.
template <typename Launch>
at::Tensor roi_pool_backward_launch(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    int64_t pooled_height, int64_t pooled_width, int64_t batch_size, int64_t channels,
    int64_t height, int64_t width, const Launch& launch) {
  const at::ScalarType acc_type = at::toOpMathType(grad.scalar_type());
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_type));
  const int64_t total = grad.numel();
  if (total == 0 || height == 0 || width == 0) {
    return grad_input.to(grad.scalar_type());
  }

  const at::Tensor rois_c = rois.contiguous();
  const at::Tensor argmax_c = argmax.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "detcore_roi_pool_backward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        // grad is read through its strides: an expanded grad (out.sum()) is not materialized.
        launch(
            dim3(roi_pool_blocks(total, launch.limits.max_blocks)), dim3(kRoiPoolThreads), 0,
            roi_pool_backward_kernel<scalar_t, acc_t>, total,
            static_cast<const scalar_t*>(grad.data_ptr<scalar_t>()), grad.stride(0),
            grad.stride(1), grad.stride(2), grad.stride(3),
            static_cast<const int32_t*>(argmax_c.data_ptr<int32_t>()),
            static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()), batch_size, channels,
            height, width, pooled_height, pooled_width, grad_input.data_ptr<acc_t>());
      });
  // A no-op for float / double (same dtype); one cast for half / bfloat16.
  return grad_input.to(grad.scalar_type());
}

}  // namespace detcore
