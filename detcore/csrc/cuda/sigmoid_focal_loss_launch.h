// Host side of the CUDA sigmoid_focal_loss and its backward: the buffers, the empty cases, the
// dtype dispatch and the launches of sigmoid_focal_loss_kernels.cuh's kernels. Shared by the real
// launcher (sigmoid_focal_loss_kernel.cu) and the CUDA emulation of the tests, which pass their
// launch policy (launch_config.h), so that both run exactly this sequence. Each returns, last,
// the kernels' first_bad ([1], int64): the lowest index of a target outside [0, 1], or n; the
// launcher turns it into the error.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <limits>
#include <tuple>

#include "../checks.h"  // FocalReduction
#include "launch_config.h"
#include "sigmoid_focal_loss_kernels.cuh"

namespace detcore {

// -> (loss, first_bad)
template <typename Launch>
std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_forward_launch(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    FocalReduction r, const Launch& launch) {
  const int64_t n = inputs.numel();
  at::Tensor first_bad = at::full({1}, n, inputs.options().dtype(at::kLong));
  if (n == 0) {
    const double empty = r == FocalReduction::kMean ? std::numeric_limits<double>::quiet_NaN() : 0;
    return {r == FocalReduction::kNone ? at::empty(inputs.sizes(), inputs.options())
                                       : at::full({}, empty, inputs.options()),
            first_bad};
  }
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  // A function of n alone (launch_config.h): the sum's order, and so its bits, too.
  const unsigned int blocks = focal_loss_blocks(n, launch.limits.max_blocks);
  at::Tensor loss = r == FocalReduction::kNone ? launch.empty(inputs.sizes(), inputs.options())
                                               : launch.empty({}, inputs.options());
  at::Tensor block_sums;
  if (r != FocalReduction::kNone) {
    block_sums = launch.empty({blocks}, inputs.options().dtype(at::kDouble));
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, inputs.scalar_type(), "detcore_sigmoid_focal_loss_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(blocks), dim3(kFocalLossThreads), 0,
            sigmoid_focal_loss_forward_kernel<scalar_t, acc_t>, n,
            static_cast<const scalar_t*>(x.data_ptr<scalar_t>()),
            static_cast<const scalar_t*>(t.data_ptr<scalar_t>()),
            focal_params<acc_t>(alpha, gamma),
            r == FocalReduction::kNone ? loss.data_ptr<scalar_t>() : nullptr,
            r == FocalReduction::kNone ? nullptr : block_sums.data_ptr<double>(),
            reinterpret_cast<long long*>(first_bad.data_ptr<int64_t>()));
        if (r != FocalReduction::kNone) {
          const double divisor = r == FocalReduction::kMean ? static_cast<double>(n) : 1.0;
          launch(
              dim3(1), dim3(kFocalLossThreads), 0, sigmoid_focal_loss_sum_kernel<scalar_t>,
              static_cast<int64_t>(blocks),
              static_cast<const double*>(block_sums.data_ptr<double>()), divisor,
              loss.data_ptr<scalar_t>());
        }
      });
  return {loss, first_bad};
}

// -> (grad_inputs, grad_targets ([0] unless targets_grad), first_bad)
template <typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor> sigmoid_focal_loss_backward_launch(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, FocalReduction r, bool targets_grad, const Launch& launch) {
  const int64_t n = inputs.numel();
  at::Tensor first_bad = at::full({1}, n, inputs.options().dtype(at::kLong));
  at::Tensor grad_inputs = launch.empty(inputs.sizes(), inputs.options());
  at::Tensor grad_targets =
      launch.empty(targets_grad ? inputs.sizes() : at::IntArrayRef{0}, inputs.options());
  if (n == 0) {
    return {grad_inputs, grad_targets, first_bad};
  }
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  // One value for all: a reduction, or the expanded (all-zero strides) grad of loss.sum().
  bool broadcast = true;
  for (int64_t s : grad.strides()) broadcast = broadcast && s == 0;
  const bool per_element = !broadcast;
  const at::Tensor g = per_element ? grad.contiguous() : grad;
  const double divisor = r == FocalReduction::kMean ? static_cast<double>(n) : 1.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, inputs.scalar_type(),
      "detcore_sigmoid_focal_loss_backward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(focal_loss_blocks(n, launch.limits.max_blocks)), dim3(kFocalLossThreads), 0,
            sigmoid_focal_loss_backward_kernel<scalar_t, acc_t>, n,
            static_cast<const scalar_t*>(g.data_ptr<scalar_t>()), per_element, divisor,
            static_cast<const scalar_t*>(x.data_ptr<scalar_t>()),
            static_cast<const scalar_t*>(t.data_ptr<scalar_t>()),
            focal_params<acc_t>(alpha, gamma), grad_inputs.data_ptr<scalar_t>(),
            targets_grad ? grad_targets.data_ptr<scalar_t>() : nullptr,
            reinterpret_cast<long long*>(first_bad.data_ptr<int64_t>()));
      });
  return {grad_inputs, grad_targets, first_bad};
}

}  // namespace detcore
