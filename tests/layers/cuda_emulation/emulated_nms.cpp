// torch.ops.detcore_emulated.nms* : detcore's CUDA NMS kernels (nms_kernels.cuh) run by the CUDA
// emulation on CPU tensors, through the launcher's own host sequence (nms_launch.h), and its two
// steps on their own (the mask, the unwrap). The grid and shared-memory limits, and the size above
// which batched_nms takes the banded path, are arguments, defaulting to the real ones.
#include "emulated_launch.h"  // first: the emulation before detcore's headers

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/nms_launch.h"

namespace {

using cuda_emulation::EmulatedLaunch;

EmulatedLaunch with_limits(
    int64_t max_grid_dim, int64_t max_shared_words,
    int64_t nms_band_above = detcore::kNmsBandAbove) {
  EmulatedLaunch launch;
  launch.limits.max_grid_dim = max_grid_dim;
  launch.limits.max_shared_words = max_shared_words;
  launch.limits.nms_band_above = nms_band_above;
  return launch;
}

// The kernels take int64 category ids (the real launcher's category_ids makes them).
at::Tensor categories_of(const std::optional<at::Tensor>& idxs) {
  return idxs.has_value() ? idxs->to(at::kLong) : at::Tensor();
}

// The mask, [n, ceil(n / 64)]; words the kernel does not write are garbage.
at::Tensor nms_mask(
    const at::Tensor& sorted_boxes, const std::optional<at::Tensor>& sorted_categories,
    double iou_threshold, int64_t max_grid_dim) {
  return detcore::nms_mask_launch(
      sorted_boxes, categories_of(sorted_categories), iou_threshold,
      with_limits(max_grid_dim, detcore::kMaxSharedWords));
}

// The keep flag of each sorted box, from a mask [n, ceil(n / 64)].
at::Tensor nms_unwrap(const at::Tensor& mask, int64_t max_shared_words) {
  TORCH_CHECK(
      mask.dim() == 2 && mask.size(1) == detcore::nms_launch(mask.size(0)).col_blocks,
      "nms_unwrap: mask must be [n, ceil(n / 64)]");
  return detcore::nms_unwrap_launch(
      mask.contiguous(), with_limits(detcore::kMaxGridDim, max_shared_words));
}

at::Tensor nms(
    const at::Tensor& boxes, const at::Tensor& scores, const std::optional<at::Tensor>& idxs,
    double iou_threshold, int64_t max_grid_dim, int64_t max_shared_words, int64_t band_above) {
  return detcore::nms_kept_launch(
      boxes, scores, categories_of(idxs), iou_threshold,
      with_limits(max_grid_dim, max_shared_words, band_above));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limits = "int max_grid_dim=" + std::to_string(detcore::kMaxGridDim);
  const std::string shared = "int max_shared_words=" + std::to_string(detcore::kMaxSharedWords);
  const std::string band = "int band_above=" + std::to_string(detcore::kNmsBandAbove);
  m.def(
      ("nms_mask(Tensor sorted_boxes, Tensor? sorted_categories, float iou_threshold, " + limits +
       ") -> Tensor").c_str(),
      &nms_mask);
  m.def(("nms_unwrap(Tensor mask, " + shared + ") -> Tensor").c_str(), &nms_unwrap);
  m.def(
      ("nms(Tensor boxes, Tensor scores, Tensor? idxs, float iou_threshold, " + limits + ", " +
       shared + ", " + band + ") -> Tensor").c_str(),
      &nms);
}
