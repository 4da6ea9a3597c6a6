// Host side of the CUDA nms and batched_nms: the score order, the mask and keep buffers, the
// dtype dispatch and the launches of nms_kernels.cuh's kernels, then the kept indices. Shared by
// the real launcher (nms_kernel.cu) and the CUDA emulation of the tests, which pass their launch
// policy (launch_config.h), so that both run exactly this sequence. The mask never leaves the
// device; the only host sync is masked_select's, for the result size.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <tuple>

#include "../nms_common.h"
#include "launch_config.h"
#include "nms_kernels.cuh"

namespace detcore {

inline unsigned long long* nms_words(const at::Tensor& words) {
  return reinterpret_cast<unsigned long long*>(words.data_ptr<int64_t>());
}

// The mask [n, ceil(n / 64)] (int64 words) of boxes sorted by decreasing score; categories
// (int64, sorted likewise) is undefined for plain nms. Only the words that the unwrap reads are
// written (nms_mask_kernel).
template <typename Launch>
at::Tensor nms_mask_launch(
    const at::Tensor& sorted_boxes, const at::Tensor& sorted_categories, double iou_threshold,
    const Launch& launch) {
  const int64_t n = sorted_boxes.size(0);
  const NmsLaunch l = nms_launch(n, launch.limits.max_grid_dim, launch.limits.max_shared_words);
  at::Tensor mask = launch.empty({n, l.col_blocks}, sorted_boxes.options().dtype(at::kLong));
  if (n == 0) {
    return mask;
  }
  const at::Tensor boxes = sorted_boxes.contiguous();
  const at::Tensor categories =
      sorted_categories.defined() ? sorted_categories.contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, boxes.scalar_type(), "detcore_nms_mask_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(l.grid_x, l.grid_y), dim3(kBlockBoxes), 0, nms_mask_kernel<scalar_t, acc_t>, n,
            l.col_blocks, static_cast<const scalar_t*>(boxes.data_ptr<scalar_t>()),
            static_cast<const int64_t*>(
                categories.defined() ? categories.data_ptr<int64_t>() : nullptr),
            threshold_in<acc_t>(iou_threshold), nms_words(mask));
      });
  return mask;
}

// The keep flag of each sorted box, from a contiguous mask [n, ceil(n / 64)].
template <typename Launch>
at::Tensor nms_unwrap_launch(const at::Tensor& mask, const Launch& launch) {
  const int64_t n = mask.size(0);
  const NmsLaunch l = nms_launch(n, launch.limits.max_grid_dim, launch.limits.max_shared_words);
  at::Tensor keep = launch.empty({n}, mask.options().dtype(at::kBool));
  if (n == 0) {
    return keep;
  }
  at::Tensor removed_global;  // the kernel zeroes it
  if (!l.unwrap_in_shared) {
    removed_global = launch.empty({l.col_blocks}, mask.options());
  }
  launch(
      dim3(1), dim3(kUnwrapThreads), l.unwrap_shared_bytes, nms_unwrap_kernel, n, l.col_blocks,
      static_cast<const unsigned long long*>(nms_words(mask)), l.unwrap_in_shared,
      removed_global.defined() ? nms_words(removed_global) : nullptr, keep.data_ptr<bool>());
  return keep;
}

// The kept indices, by decreasing score (equal scores: lower index first, as the CPU kernel).
// categories: int64 ids for batched_nms, undefined for nms.
template <typename Launch>
at::Tensor nms_kept_launch(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& categories,
    double iou_threshold, const Launch& launch) {
  if (boxes.size(0) == 0) {
    return at::empty({0}, boxes.options().dtype(at::kLong));
  }
  const at::Tensor order = std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor sorted_categories =
      categories.defined() ? categories.index_select(0, order) : at::Tensor();
  const at::Tensor mask =
      nms_mask_launch(boxes.index_select(0, order), sorted_categories, iou_threshold, launch);
  return order.masked_select(nms_unwrap_launch(mask, launch));
}

}  // namespace detcore
