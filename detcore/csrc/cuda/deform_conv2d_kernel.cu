// Launchers of deform_conv2d and its backward: the argument checks, the device, the stream and
// the non-determinism alert; the buffers and the sequence of kernels and GEMMs are
// deform_conv2d_launch.h's (shared with the CUDA emulation of the tests), the kernels
// deform_conv2d_kernels.cuh's.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>

#include "../checks.h"
#include "cuda_launch.h"
#include "deform_conv2d_launch.h"

namespace detcore {
namespace {

at::Tensor deform_conv2d_forward_cuda(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  check_deform_conv2d_inputs(
      "deform_conv2d", input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, groups, offset_groups);
  at::cuda::CUDAGuard device_guard(input.device());
  const DeformConvArguments a{stride_h, stride_w, pad_h, pad_w,
                              dilation_h, dilation_w, groups, offset_groups};
  return deform_conv2d_forward_launch(input, weight, offset, mask, bias, a, CudaLaunch{});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
deform_conv2d_backward_cuda(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
    int64_t offset_groups) {
  check_deform_conv2d_backward_inputs(
      grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w, groups, offset_groups);
  at::cuda::CUDAGuard device_guard(input.device());
  // col2im adds with atomics in whatever order the threads arrive: the input gradient's float
  // sums vary run to run.
  at::globalContext().alertNotDeterministic("deform_conv2d_backward_cuda");
  const DeformConvArguments a{stride_h, stride_w, pad_h, pad_w,
                              dilation_h, dilation_w, groups, offset_groups};
  return deform_conv2d_backward_launch(grad, input, weight, offset, mask, a, CudaLaunch{});
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_forward_cuda));
  m.impl("_deform_conv2d_backward", TORCH_FN(deform_conv2d_backward_cuda));
}

}  // namespace detcore
