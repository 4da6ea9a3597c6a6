// Autograd for sigmoid_focal_loss, in C++ so it also works where Python does not run. Both
// inputs (logits) and targets get gradients, as with torchvision's Python version (soft targets
// may be computed); the targets' is only computed when they require it. The backward recomputes
// everything from the saved inputs and targets: nothing of the forward's size is kept. The
// backward op is not itself differentiable: asking for a double backward is an error.
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "../dispatch.h"
#include "../value_checks.h"

namespace detcore {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Wraps the backward op so that differentiating through it raises instead of silently
// producing a wrong (zero) second derivative.
class SigmoidFocalLossBackwardFunction
    : public torch::autograd::Function<SigmoidFocalLossBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext*, const at::Tensor& grad, const at::Tensor& inputs,
      const at::Tensor& targets, double alpha, double gamma, c10::string_view reduction,
      bool targets_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [grad_inputs, grad_targets] = call_sigmoid_focal_loss_backward(
        grad, inputs, targets, alpha, gamma, reduction, targets_grad);
    return {grad_inputs, grad_targets};
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    TORCH_CHECK(false, "detcore sigmoid_focal_loss: double backward is not supported");
    return {};
  }
};

class SigmoidFocalLossFunction : public torch::autograd::Function<SigmoidFocalLossFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
      double gamma, c10::string_view reduction) {
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["gamma"] = gamma;
    ctx->saved_data["reduction"] = std::string(reduction);
    // The backward runs later, on another thread for CUDA: it checks values as this call did.
    ctx->saved_data["value_checks"] = value_checks_enabled();
    ctx->save_for_backward({inputs, targets});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_sigmoid_focal_loss(inputs, targets, alpha, gamma, reduction)};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grad_output) {
    const auto saved = ctx->get_saved_variables();
    const bool targets_grad = ctx->needs_input_grad(1);
    const std::string reduction = ctx->saved_data["reduction"].toStringRef();
    const ValueChecksGuard checks(ctx->saved_data["value_checks"].toBool());
    auto grads = SigmoidFocalLossBackwardFunction::apply(
        grad_output[0], saved[0], saved[1], ctx->saved_data["alpha"].toDouble(),
        ctx->saved_data["gamma"].toDouble(), reduction, targets_grad);
    return {grads[0], targets_grad ? grads[1] : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor sigmoid_focal_loss_autograd(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction) {
  return SigmoidFocalLossFunction::apply(inputs, targets, alpha, gamma, reduction)[0];
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward_autograd(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad) {
  auto grads = SigmoidFocalLossBackwardFunction::apply(
      grad, inputs, targets, alpha, gamma, reduction, targets_grad);
  return {grads[0], grads[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, Autograd, m) {
  m.impl("sigmoid_focal_loss", TORCH_FN(sigmoid_focal_loss_autograd));
  m.impl("_sigmoid_focal_loss_backward", TORCH_FN(sigmoid_focal_loss_backward_autograd));
}

}  // namespace detcore
