// Launchers of sigmoid_focal_loss and its backward: the argument checks, the device, the stream
// and the report of a bad target; the buffers and launches are sigmoid_focal_loss_launch.h's
// (shared with the CUDA emulation of the tests), the kernels sigmoid_focal_loss_kernels.cuh's.
// Deterministic: no atomics on values (see the kernels). The targets' check costs one small copy
// to the host (a sync) per call, as the rois' checks of roi_align do, unless value checks are off
// (value_checks.h).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "../checks.h"
#include "../value_checks.h"
#include "cuda_launch.h"
#include "sigmoid_focal_loss_launch.h"

namespace detcore {
namespace {

// Raises for the first target the kernels found outside [0, 1] (first_bad < n). With value checks
// off nothing is read back: such targets give a loss outside the focal loss's range, no error.
void report_bad_target(
    const char* op, const at::Tensor& first_bad, const at::Tensor& targets, int64_t n) {
  if (!value_checks_enabled()) {
    return;
  }
  const int64_t index = first_bad.item<int64_t>();
  if (index < n) {
    const double value = targets.reshape(-1)[index].item<double>();
    throw_bad_focal_target(op, targets.sizes(), index, value);
  }
}

at::Tensor sigmoid_focal_loss_forward_cuda(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction) {
  const char* op = "sigmoid_focal_loss";
  const FocalReduction r =
      check_sigmoid_focal_loss_inputs(op, inputs, targets, alpha, gamma, reduction);
  at::cuda::CUDAGuard device_guard(inputs.device());
  auto [loss, first_bad] =
      sigmoid_focal_loss_forward_launch(inputs, targets, alpha, gamma, r, CudaLaunch{});
  report_bad_target(op, first_bad, targets, inputs.numel());
  return loss;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward_cuda(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad) {
  const char* op = "sigmoid_focal_loss backward";
  const FocalReduction r =
      check_sigmoid_focal_loss_backward_inputs(grad, inputs, targets, alpha, gamma, reduction);
  at::cuda::CUDAGuard device_guard(inputs.device());
  auto [grad_inputs, grad_targets, first_bad] = sigmoid_focal_loss_backward_launch(
      grad, inputs, targets, alpha, gamma, r, targets_grad, CudaLaunch{});
  report_bad_target(op, first_bad, targets, inputs.numel());
  return {grad_inputs, grad_targets};
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("sigmoid_focal_loss", TORCH_FN(sigmoid_focal_loss_forward_cuda));
  m.impl("_sigmoid_focal_loss_backward", TORCH_FN(sigmoid_focal_loss_backward_cuda));
}

}  // namespace detcore
