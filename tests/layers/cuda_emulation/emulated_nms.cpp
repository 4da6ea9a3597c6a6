// torch.ops.detcore_emulated.nms* : detcore's CUDA NMS kernels (nms_kernels.cuh) run by the CUDA
// emulation on CPU tensors, launched like nms_kernel.cu launches them (launch_config.h). The grid
// and shared-memory limits are arguments, defaulting to the real ones.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "cuda_emulation.h"
#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/nms_kernels.cuh"

namespace {

using detcore::kBlockBoxes;

unsigned long long* words(const at::Tensor& t) {
  return reinterpret_cast<unsigned long long*>(t.data_ptr<int64_t>());
}

// The mask, [n, col_blocks]; words the kernel does not write keep a marker value.
at::Tensor nms_mask(
    const at::Tensor& sorted_boxes, const std::optional<at::Tensor>& sorted_categories,
    double iou_threshold, int64_t max_grid_dim) {
  const int64_t n = sorted_boxes.size(0);
  const detcore::NmsLaunch launch = detcore::nms_launch(n, max_grid_dim);
  at::Tensor mask = at::full({n, launch.col_blocks}, 0x5A5A5A5A5A5A5A5ALL, at::kLong);
  if (n == 0) {
    return mask;
  }
  const at::Tensor boxes = sorted_boxes.contiguous();
  const at::Tensor categories =
      sorted_categories.has_value() ? sorted_categories->to(at::kLong).contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "nms_mask", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cuda_emulation::launch(
        dim3(launch.grid_x, launch.grid_y), dim3(kBlockBoxes), 0,
        detcore::nms_mask_kernel<scalar_t, acc_t>, n, launch.col_blocks,
        boxes.data_ptr<scalar_t>(),
        categories.defined() ? categories.data_ptr<int64_t>() : nullptr, iou_threshold,
        words(mask));
  });
  return mask;
}

// The keep flag of each sorted box, from a mask [n, col_blocks].
at::Tensor nms_unwrap(const at::Tensor& mask, int64_t max_shared_words) {
  const int64_t n = mask.size(0);
  const detcore::NmsLaunch launch = detcore::nms_launch(n, detcore::kMaxGridDim, max_shared_words);
  TORCH_CHECK(mask.size(1) == launch.col_blocks, "nms_unwrap: mask must be [n, ceil(n / 64)]");
  at::Tensor keep = at::empty({n}, at::kBool);
  if (n == 0) {
    return keep;
  }
  const at::Tensor mask_c = mask.contiguous();
  at::Tensor removed_global;
  if (!launch.unwrap_in_shared) {  // garbage, like at::empty on the GPU: the kernel zeroes it
    removed_global = at::full({launch.col_blocks}, 0x3C3C3C3C3C3C3C3CLL, at::kLong);
  }
  cuda_emulation::launch(
      dim3(1), dim3(detcore::kUnwrapThreads), launch.unwrap_shared_bytes,
      detcore::nms_unwrap_kernel, n, launch.col_blocks,
      static_cast<const unsigned long long*>(words(mask_c)), launch.unwrap_in_shared,
      removed_global.defined() ? words(removed_global) : nullptr, keep.data_ptr<bool>());
  return keep;
}

// nms_kernel.cu's nms_impl: sort, mask, unwrap, kept indices in score order.
at::Tensor nms(
    const at::Tensor& boxes, const at::Tensor& scores, const std::optional<at::Tensor>& idxs,
    double iou_threshold, int64_t max_grid_dim, int64_t max_shared_words) {
  if (boxes.size(0) == 0) {
    return at::empty({0}, at::kLong);
  }
  const at::Tensor order = std::get<1>(scores.sort(/*stable=*/true, 0, /*descending=*/true));
  std::optional<at::Tensor> sorted_categories;
  if (idxs.has_value()) {
    sorted_categories = idxs->index_select(0, order);
  }
  const at::Tensor mask =
      nms_mask(boxes.index_select(0, order), sorted_categories, iou_threshold, max_grid_dim);
  return order.masked_select(nms_unwrap(mask, max_shared_words));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limits = "int max_grid_dim=" + std::to_string(detcore::kMaxGridDim);
  const std::string shared = "int max_shared_words=" + std::to_string(detcore::kMaxSharedWords);
  m.def(
      ("nms_mask(Tensor sorted_boxes, Tensor? sorted_categories, float iou_threshold, " + limits +
       ") -> Tensor").c_str(),
      &nms_mask);
  m.def(("nms_unwrap(Tensor mask, " + shared + ") -> Tensor").c_str(), &nms_unwrap);
  m.def(
      ("nms(Tensor boxes, Tensor scores, Tensor? idxs, float iou_threshold, " + limits + ", " +
       shared + ") -> Tensor").c_str(),
      &nms);
}
