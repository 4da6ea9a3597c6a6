// Launchers of sigmoid_focal_loss and its backward; the kernels are in
// sigmoid_focal_loss_kernels.cuh, the grid in launch_config.h. Deterministic: no atomics on
// values (see the kernels). The targets' check costs one small copy to the host (a sync) per
// call, as the rois' checks of roi_align do, unless value checks are off (value_checks.h).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <tuple>

#include "../checks.h"
#include "../value_checks.h"
#include "launch_config.h"
#include "sigmoid_focal_loss_kernels.cuh"

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
  const int64_t n = inputs.numel();
  if (n == 0) {
    const double empty = r == FocalReduction::kMean ? std::numeric_limits<double>::quiet_NaN() : 0;
    return r == FocalReduction::kNone ? at::empty(inputs.sizes(), inputs.options())
                                      : at::full({}, empty, inputs.options());
  }
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  const unsigned int blocks = focal_loss_blocks(n);
  at::Tensor loss = r == FocalReduction::kNone ? at::empty(inputs.sizes(), inputs.options())
                                               : at::empty({}, inputs.options());
  at::Tensor block_sums;
  if (r != FocalReduction::kNone) {
    block_sums = at::empty({blocks}, inputs.options().dtype(at::kDouble));
  }
  at::Tensor first_bad = at::full({1}, n, inputs.options().dtype(at::kLong));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, inputs.scalar_type(), "detcore_sigmoid_focal_loss_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        sigmoid_focal_loss_forward_kernel<scalar_t, acc_t>
            <<<blocks, kFocalLossThreads, 0, stream>>>(
                n, x.data_ptr<scalar_t>(), t.data_ptr<scalar_t>(),
                focal_params<acc_t>(alpha, gamma),
                r == FocalReduction::kNone ? loss.data_ptr<scalar_t>() : nullptr,
                r == FocalReduction::kNone ? nullptr : block_sums.data_ptr<double>(),
                reinterpret_cast<long long*>(first_bad.data_ptr<int64_t>()));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (r != FocalReduction::kNone) {
          const double divisor = r == FocalReduction::kMean ? static_cast<double>(n) : 1.0;
          sigmoid_focal_loss_sum_kernel<scalar_t><<<1, kFocalLossThreads, 0, stream>>>(
              blocks, block_sums.data_ptr<double>(), divisor, loss.data_ptr<scalar_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      });
  report_bad_target(op, first_bad, t, n);
  return loss;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward_cuda(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad) {
  const char* op = "sigmoid_focal_loss backward";
  const FocalReduction r =
      check_sigmoid_focal_loss_backward_inputs(grad, inputs, targets, alpha, gamma, reduction);
  at::cuda::CUDAGuard device_guard(inputs.device());
  const int64_t n = inputs.numel();
  at::Tensor grad_inputs = at::empty(inputs.sizes(), inputs.options());
  at::Tensor grad_targets =
      at::empty(targets_grad ? inputs.sizes() : at::IntArrayRef{0}, inputs.options());
  if (n == 0) {
    return {grad_inputs, grad_targets};
  }
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  // One value for all: a reduction, or the expanded (all-zero strides) grad of loss.sum().
  bool broadcast = true;
  for (int64_t s : grad.strides()) broadcast = broadcast && s == 0;
  const bool per_element = !broadcast;
  const at::Tensor g = per_element ? grad.contiguous() : grad;
  const double divisor = r == FocalReduction::kMean ? static_cast<double>(n) : 1.0;
  at::Tensor first_bad = at::full({1}, n, inputs.options().dtype(at::kLong));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, inputs.scalar_type(),
      "detcore_sigmoid_focal_loss_backward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        sigmoid_focal_loss_backward_kernel<scalar_t, acc_t>
            <<<focal_loss_blocks(n), kFocalLossThreads, 0, stream>>>(
                n, g.data_ptr<scalar_t>(), per_element, divisor, x.data_ptr<scalar_t>(),
                t.data_ptr<scalar_t>(), focal_params<acc_t>(alpha, gamma),
                grad_inputs.data_ptr<scalar_t>(),
                targets_grad ? grad_targets.data_ptr<scalar_t>() : nullptr,
                reinterpret_cast<long long*>(first_bad.data_ptr<int64_t>()));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  report_bad_target(op, first_bad, t, n);
  return {grad_inputs, grad_targets};
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("sigmoid_focal_loss", TORCH_FN(sigmoid_focal_loss_forward_cuda));
  m.impl("_sigmoid_focal_loss_backward", TORCH_FN(sigmoid_focal_loss_backward_cuda));
}

}  // namespace detcore
