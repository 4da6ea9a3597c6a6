// Autograd for deform_conv2d, in C++ so it also works where Python does not run (TorchScript
// deployments). Gradients flow to input, weight, offset, mask and bias; the backward op is not
// itself differentiable: asking for a double backward is an error.
#include <torch/autograd.h>
#include <torch/library.h>

#include "../dispatch.h"

namespace detcore {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct DeformConvArgs {
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups;
};

void save_args(AutogradContext* ctx, const DeformConvArgs& a) {
  ctx->saved_data["args"] = std::vector<int64_t>{
      a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dilation_h, a.dilation_w, a.groups,
      a.offset_groups};
}

DeformConvArgs load_args(AutogradContext* ctx) {
  const auto v = ctx->saved_data["args"].toIntVector();
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
}

c10::optional<at::Tensor> optional_of(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// Wraps the backward op so that differentiating through it raises instead of silently
// producing a wrong (zero) second derivative.
class DeformConv2dBackwardFunction
    : public torch::autograd::Function<DeformConv2dBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext*, const at::Tensor& grad, const at::Tensor& input,
      const at::Tensor& weight, const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
      const c10::optional<at::Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
      int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto r = call_deform_conv2d_backward(
        grad, input, weight, offset, mask, bias, stride_h, stride_w,
        pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups);
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<4>(r)};
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK(false, "detcore deform_conv2d: double backward is not supported");
    return {};
  }
};

class DeformConv2dFunction : public torch::autograd::Function<DeformConv2dFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
      const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
      const c10::optional<at::Tensor>& bias, int64_t stride_h,
      int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
      int64_t groups, int64_t offset_groups) {
    save_args(
        ctx, {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups});
    // Undefined tensors stand for an absent mask or bias.
    ctx->save_for_backward(
        {input, weight, offset, mask.value_or(at::Tensor()), bias.value_or(at::Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_deform_conv2d(
        input, weight, offset, mask, bias, stride_h, stride_w, pad_h,
        pad_w, dilation_h, dilation_w, groups, offset_groups)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grad_output) {
    const auto saved = ctx->get_saved_variables();
    const DeformConvArgs a = load_args(ctx);
    auto grads = DeformConv2dBackwardFunction::apply(
        grad_output[0], saved[0], saved[1], saved[2], optional_of(saved[3]), optional_of(saved[4]),
        a.stride_h, a.stride_w,
        a.pad_h, a.pad_w, a.dilation_h, a.dilation_w, a.groups, a.offset_groups);
    const at::Tensor none;
    return {grads[0],
            grads[1],
            grads[2],
            saved[3].defined() ? grads[3] : none,
            saved[4].defined() ? grads[4] : none,
            none, none, none, none, none, none, none, none};
  }
};

at::Tensor deform_conv2d_autograd(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  return DeformConv2dFunction::apply(
      input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups)[0];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
deform_conv2d_backward_autograd(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
    int64_t offset_groups) {
  auto r = DeformConv2dBackwardFunction::apply(
      grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups);
  return {r[0], r[1], r[2], r[3], r[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, Autograd, m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_autograd));
  m.impl("_deform_conv2d_backward", TORCH_FN(deform_conv2d_backward_autograd));
}

}  // namespace detcore
