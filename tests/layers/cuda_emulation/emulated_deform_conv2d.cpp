// torch.ops.detcore_emulated.deform_conv2d* : detcore's CUDA deform_conv2d kernels
// (deform_conv2d_kernels.cuh) run by the CUDA emulation on CPU tensors, through the launcher's
// own host sequence (deform_conv2d_launch.h). The grid limit is an argument, defaulting to the
// real one.
#include "emulated_launch.h"  // first: the emulation before detcore's headers

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "detcore/csrc/cuda/deform_conv2d_launch.h"
#include "detcore/csrc/cuda/launch_config.h"

namespace {

using cuda_emulation::with_max_blocks;
using detcore::DeformConvArguments;

at::Tensor deform_conv2d(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups, int64_t max_blocks) {
  const DeformConvArguments a{stride_h, stride_w, pad_h, pad_w,
                              dilation_h, dilation_w, groups, offset_groups};
  return detcore::deform_conv2d_forward_launch(
      input, weight, offset, mask, bias, a, with_max_blocks(max_blocks));
}

at::Tensor deform_conv2d_columns(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups,
    int64_t max_blocks) {
  const DeformConvArguments a{stride_h, stride_w, pad_h, pad_w,
                              dilation_h, dilation_w, groups, offset_groups};
  return detcore::deform_conv2d_columns(
      input, weight, offset, mask, a, with_max_blocks(max_blocks));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask, int64_t stride_h,
    int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
    int64_t groups, int64_t offset_groups, int64_t max_blocks) {
  const DeformConvArguments a{stride_h, stride_w, pad_h, pad_w,
                              dilation_h, dilation_w, groups, offset_groups};
  return detcore::deform_conv2d_backward_launch(
      grad, input, weight, offset, mask, a, with_max_blocks(max_blocks));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limit = "int max_blocks=" + std::to_string(detcore::kMaxBlocks);
  const std::string geometry =
      "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, "
      "int groups, int offset_groups, ";
  m.def(
      ("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor? mask, Tensor? bias, " +
       geometry + limit + ") -> Tensor").c_str(),
      &deform_conv2d);
  m.def(
      ("deform_conv2d_columns(Tensor input, Tensor weight, Tensor offset, Tensor? mask, " +
       geometry + limit + ") -> Tensor").c_str(),
      &deform_conv2d_columns);
  m.def(
      ("deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
       "Tensor? mask, " + geometry + limit +
       ") -> (Tensor, Tensor, Tensor, Tensor, Tensor)").c_str(),
      &deform_conv2d_backward);
}
