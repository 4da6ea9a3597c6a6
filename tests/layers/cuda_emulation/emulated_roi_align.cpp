// torch.ops.detcore_emulated.roi_align* : detcore's CUDA ROIAlign kernels (roi_align_kernels.cuh)
// run by the CUDA emulation on CPU tensors, through the launcher's own host sequence
// (roi_align_launch.h). The grid limit is an argument, defaulting to the real one.
#include "emulated_launch.h"  // first: the emulation before detcore's headers

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/roi_align_launch.h"

namespace {

using cuda_emulation::with_max_blocks;

at::Tensor roi_align(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned, int64_t max_blocks) {
  return detcore::roi_align_forward_launch(
      input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
      with_max_blocks(max_blocks));
}

at::Tensor roi_align_backward(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned, int64_t max_blocks) {
  return detcore::roi_align_backward_launch(
      grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio, aligned, with_max_blocks(max_blocks));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limit = "int max_blocks=" + std::to_string(detcore::kMaxBlocks);
  m.def(
      ("roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height, "
       "int pooled_width, int sampling_ratio, bool aligned, " + limit + ") -> Tensor").c_str(),
      &roi_align);
  m.def(
      ("roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
       "int pooled_width, int batch_size, int channels, int height, int width, "
       "int sampling_ratio, bool aligned, " + limit + ") -> Tensor").c_str(),
      &roi_align_backward);
}
