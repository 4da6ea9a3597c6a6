// torch.ops.detcore_emulated.sigmoid_focal_loss* : detcore's CUDA focal loss kernels
// (sigmoid_focal_loss_kernels.cuh) run by the CUDA emulation on CPU tensors, launched like
// sigmoid_focal_loss_kernel.cu launches them (launch_config.h). The grid limit is an argument,
// defaulting to the real one. Each op also returns the kernels' first_bad: the lowest index of a
// target outside [0, 1], or n (the launcher turns it into the error).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <tuple>

#include "cuda_emulation.h"
#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/sigmoid_focal_loss_kernels.cuh"

namespace {

using detcore::focal_loss_blocks;
using detcore::kFocalLossThreads;

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction, int64_t max_blocks) {
  const int64_t n = inputs.numel();
  const bool none = reduction == "none";
  at::Tensor first_bad = at::full({1}, n, inputs.options().dtype(at::kLong));
  // NaN where the kernels write nothing, like the uninitialized memory of at::empty on the GPU.
  at::Tensor loss = at::full(none ? inputs.sizes() : at::IntArrayRef{}, NAN, inputs.options());
  if (n == 0) {
    return {none ? loss : at::full({}, reduction == "mean" ? NAN : 0.0, inputs.options()), first_bad};
  }
  const unsigned int blocks = focal_loss_blocks(n, max_blocks);
  at::Tensor block_sums = at::full({blocks}, NAN, inputs.options().dtype(at::kDouble));
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, inputs.scalar_type(), "focal", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cuda_emulation::launch(
        dim3(blocks), dim3(kFocalLossThreads), 0,
        detcore::sigmoid_focal_loss_forward_kernel<scalar_t, acc_t>, n,
        static_cast<const scalar_t*>(x.data_ptr<scalar_t>()),
        static_cast<const scalar_t*>(t.data_ptr<scalar_t>()),
        detcore::focal_params<acc_t>(alpha, gamma),
        none ? loss.data_ptr<scalar_t>() : static_cast<scalar_t*>(nullptr),
        none ? static_cast<double*>(nullptr) : block_sums.data_ptr<double>(),
        reinterpret_cast<long long*>(first_bad.data_ptr<int64_t>()));
    if (!none) {
      const double divisor = reduction == "mean" ? static_cast<double>(n) : 1.0;
      cuda_emulation::launch(
          dim3(1), dim3(kFocalLossThreads), 0, detcore::sigmoid_focal_loss_sum_kernel<scalar_t>,
          static_cast<int64_t>(blocks), static_cast<const double*>(block_sums.data_ptr<double>()),
          divisor, loss.data_ptr<scalar_t>());
    }
  });
  return {loss, first_bad};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sigmoid_focal_loss_backward(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad, int64_t max_blocks) {
  const int64_t n = inputs.numel();
  at::Tensor first_bad = at::full({1}, n, inputs.options().dtype(at::kLong));
  at::Tensor grad_inputs = at::full(inputs.sizes(), NAN, inputs.options());
  at::Tensor grad_targets =
      at::full(targets_grad ? inputs.sizes() : at::IntArrayRef{0}, NAN, inputs.options());
  if (n == 0) {
    return {grad_inputs, grad_targets, first_bad};
  }
  bool broadcast = true;
  for (int64_t s : grad.strides()) broadcast = broadcast && s == 0;
  const at::Tensor g = broadcast ? grad : grad.contiguous();
  const double divisor = reduction == "mean" ? static_cast<double>(n) : 1.0;
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, inputs.scalar_type(), "focal", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cuda_emulation::launch(
        dim3(focal_loss_blocks(n, max_blocks)), dim3(kFocalLossThreads), 0,
        detcore::sigmoid_focal_loss_backward_kernel<scalar_t, acc_t>, n,
        static_cast<const scalar_t*>(g.data_ptr<scalar_t>()), !broadcast, divisor,
        static_cast<const scalar_t*>(x.data_ptr<scalar_t>()),
        static_cast<const scalar_t*>(t.data_ptr<scalar_t>()),
        detcore::focal_params<acc_t>(alpha, gamma), grad_inputs.data_ptr<scalar_t>(),
        targets_grad ? grad_targets.data_ptr<scalar_t>() : static_cast<scalar_t*>(nullptr),
        reinterpret_cast<long long*>(first_bad.data_ptr<int64_t>()));
  });
  return {grad_inputs, grad_targets, first_bad};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limit = "int max_blocks=" + std::to_string(detcore::kMaxBlocks);
  m.def(
      ("sigmoid_focal_loss(Tensor inputs, Tensor targets, float alpha, float gamma, "
       "str reduction, " + limit + ") -> (Tensor, Tensor)").c_str(),
      &sigmoid_focal_loss);
  m.def(
      ("sigmoid_focal_loss_backward(Tensor grad, Tensor inputs, Tensor targets, float alpha, "
       "float gamma, str reduction, bool targets_grad, " + limit +
       ") -> (Tensor, Tensor, Tensor)").c_str(),
      &sigmoid_focal_loss_backward);
}
