// torch.ops.detcore_emulated.roi_pool* : detcore's CUDA ROIPool kernels (roi_pool_kernels.cuh)
// run by the CUDA emulation on CPU tensors, through the launcher's own host sequence
// (roi_pool_launch.h). The grid limit is an argument, defaulting to the real one.
#include "emulated_launch.h"  // first: the emulation before detcore's headers

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/roi_pool_launch.h"

namespace {

using cuda_emulation::with_max_blocks;

std::tuple<at::Tensor, at::Tensor> roi_pool(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t max_blocks) {
  return detcore::roi_pool_forward_launch(
      input, rois, spatial_scale, pooled_height, pooled_width, with_max_blocks(max_blocks));
}

// The pooled size is grad's (the real op takes it as arguments, checked against grad).
at::Tensor roi_pool_backward(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    int64_t batch_size, int64_t channels, int64_t height, int64_t width, int64_t max_blocks) {
  return detcore::roi_pool_backward_launch(
      grad, rois, argmax, grad.size(2), grad.size(3), batch_size, channels, height, width,
      with_max_blocks(max_blocks));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limit = "int max_blocks=" + std::to_string(detcore::kMaxBlocks);
  m.def(
      ("roi_pool(Tensor input, Tensor rois, float spatial_scale, int pooled_height, "
       "int pooled_width, " + limit + ") -> (Tensor, Tensor)").c_str(),
      &roi_pool);
  m.def(
      ("roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, int batch_size, int channels, "
       "int height, int width, " + limit + ") -> Tensor").c_str(),
      &roi_pool_backward);
}
