// Autograd for roi_align, in C++ so it also works where Python does not run (TorchScript
// deployments). The gradient w.r.t. the rois is not defined (as in torchvision), and the
// backward op is not itself differentiable: asking for a double backward is an error.
#include <torch/autograd.h>
#include <torch/library.h>

#include "../dispatch.h"
#include "../value_checks.h"

namespace detcore {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Wraps the backward op so that differentiating through it raises instead of silently
// producing a wrong (zero) second derivative.
class ROIAlignBackwardFunction : public torch::autograd::Function<ROIAlignBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext*, const at::Tensor& grad, const at::Tensor& rois,
      double spatial_scale, int64_t pooled_height, int64_t pooled_width, c10::SymInt batch_size,
      c10::SymInt channels, c10::SymInt height, c10::SymInt width, int64_t sampling_ratio,
      bool aligned) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_roi_align_backward(
        grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
        width, sampling_ratio, aligned)};
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK(false, "detcore roi_align: double backward is not supported");
    return {};
  }
};

class ROIAlignFunction : public torch::autograd::Function<ROIAlignFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
      double spatial_scale, int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
      bool aligned) {
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["pooled_height"] = pooled_height;
    ctx->saved_data["pooled_width"] = pooled_width;
    ctx->saved_data["sampling_ratio"] = sampling_ratio;
    ctx->saved_data["aligned"] = aligned;
    // The backward runs later, on another thread for CUDA: it checks values as this call did.
    ctx->saved_data["value_checks"] = value_checks_enabled();
    // Symbolic sizes: reading concrete ones would fix a traced graph to the example's shape.
    const auto shape = input.sym_sizes();
    ctx->saved_data["batch_size"] = shape[0];
    ctx->saved_data["channels"] = shape[1];
    ctx->saved_data["height"] = shape[2];
    ctx->saved_data["width"] = shape[3];
    ctx->save_for_backward({rois});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_roi_align(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grad_output) {
    auto rois = ctx->get_saved_variables()[0];
    const ValueChecksGuard checks(ctx->saved_data["value_checks"].toBool());
    auto grad_input = ROIAlignBackwardFunction::apply(
        grad_output[0], rois, ctx->saved_data["spatial_scale"].toDouble(),
        ctx->saved_data["pooled_height"].toInt(), ctx->saved_data["pooled_width"].toInt(),
        ctx->saved_data["batch_size"].toSymInt(), ctx->saved_data["channels"].toSymInt(),
        ctx->saved_data["height"].toSymInt(), ctx->saved_data["width"].toSymInt(),
        ctx->saved_data["sampling_ratio"].toInt(), ctx->saved_data["aligned"].toBool())[0];
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor roi_align_autograd(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  return ROIAlignFunction::apply(
      input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)[0];
}

at::Tensor roi_align_backward_autograd(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
    c10::SymInt width, int64_t sampling_ratio, bool aligned) {
  return ROIAlignBackwardFunction::apply(
      grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio, aligned)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, Autograd, m) {
  m.impl("roi_align", TORCH_FN(roi_align_autograd));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_autograd));
}

}  // namespace detcore
