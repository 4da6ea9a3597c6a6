// torch.ops.detcore_emulated.sigmoid_focal_loss* : detcore's CUDA focal loss kernels
// (sigmoid_focal_loss_kernels.cuh) run by the CUDA emulation on CPU tensors, through the
// launcher's own host sequence (sigmoid_focal_loss_launch.h). The grid limit is an argument,
// defaulting to the real one. Each op also returns the kernels' first_bad: the lowest index of a
// target outside [0, 1], or n (the launcher turns it into the error).
#include "emulated_launch.h"  // first: the emulation before detcore's headers

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/sigmoid_focal_loss_launch.h"

namespace {

using cuda_emulation::with_max_blocks;
using detcore::FocalReduction;

FocalReduction reduction_of(c10::string_view reduction) {
  return reduction == "none" ? FocalReduction::kNone
         : reduction == "mean" ? FocalReduction::kMean
                               : FocalReduction::kSum;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction, int64_t max_blocks) {
  return detcore::sigmoid_focal_loss_forward_launch(
      inputs, targets, alpha, gamma, reduction_of(reduction), with_max_blocks(max_blocks));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sigmoid_focal_loss_backward(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad, int64_t max_blocks) {
  return detcore::sigmoid_focal_loss_backward_launch(
      grad, inputs, targets, alpha, gamma, reduction_of(reduction), targets_grad,
      with_max_blocks(max_blocks));
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
