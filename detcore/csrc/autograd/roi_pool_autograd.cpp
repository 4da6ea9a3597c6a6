// Autograd for roi_pool, in C++ like roi_align's. The forward's argmax (where each pooled value
// came from) is saved for the backward, which routes each gradient to that pixel. No gradient
// for the rois (as in torchvision), none for argmax (integers), and a double backward is an
// error rather than a silent zero.
#include <torch/autograd.h>
#include <torch/library.h>

#include "../dispatch.h"
#include "../value_checks.h"

namespace detcore {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ROIPoolBackwardFunction : public torch::autograd::Function<ROIPoolBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext*, const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
      double spatial_scale, int64_t pooled_height, int64_t pooled_width, c10::SymInt batch_size,
      c10::SymInt channels, c10::SymInt height, c10::SymInt width) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_roi_pool_backward(
        grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels,
        height, width)};
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK(false, "detcore roi_pool: double backward is not supported");
    return {};
  }
};

class ROIPoolFunction : public torch::autograd::Function<ROIPoolFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
      double spatial_scale, int64_t pooled_height, int64_t pooled_width) {
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["pooled_height"] = pooled_height;
    ctx->saved_data["pooled_width"] = pooled_width;
    // The backward runs later, on another thread for CUDA: it checks values as this call did.
    ctx->saved_data["value_checks"] = value_checks_enabled();
    // Symbolic sizes: reading concrete ones would fix a traced graph to the example's shape.
    const auto shape = input.sym_sizes();
    ctx->saved_data["batch_size"] = shape[0];
    ctx->saved_data["channels"] = shape[1];
    ctx->saved_data["height"] = shape[2];
    ctx->saved_data["width"] = shape[3];
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [output, argmax] =
        call_roi_pool(input, rois, spatial_scale, pooled_height, pooled_width);
    ctx->save_for_backward({rois, argmax});
    ctx->mark_non_differentiable({argmax});
    return {output, argmax};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grad_output) {
    const auto saved = ctx->get_saved_variables();
    const ValueChecksGuard checks(ctx->saved_data["value_checks"].toBool());
    auto grad_input = ROIPoolBackwardFunction::apply(
        grad_output[0], saved[0], saved[1], ctx->saved_data["spatial_scale"].toDouble(),
        ctx->saved_data["pooled_height"].toInt(), ctx->saved_data["pooled_width"].toInt(),
        ctx->saved_data["batch_size"].toSymInt(), ctx->saved_data["channels"].toSymInt(),
        ctx->saved_data["height"].toSymInt(), ctx->saved_data["width"].toSymInt())[0];
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> roi_pool_autograd(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width) {
  auto result = ROIPoolFunction::apply(input, rois, spatial_scale, pooled_height, pooled_width);
  return {result[0], result[1]};
}

at::Tensor roi_pool_backward_autograd(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    double spatial_scale, int64_t pooled_height, int64_t pooled_width, c10::SymInt batch_size,
    c10::SymInt channels, c10::SymInt height, c10::SymInt width) {
  return ROIPoolBackwardFunction::apply(
      grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels,
      height, width)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, Autograd, m) {
  m.impl("roi_pool", TORCH_FN(roi_pool_autograd));
  m.impl("_roi_pool_backward", TORCH_FN(roi_pool_backward_autograd));
}

}  // namespace detcore
