// Launchers of nms and batched_nms; the kernels are in nms_kernels.cuh, the grid in
// launch_config.h. The mask never leaves the GPU; the only host sync is masked_select's, for the
// result size, which no caller can avoid (batched_nms with floating ids adds category_ids').
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>

#include "../checks.h"
#include "../value_checks.h"
#include "launch_config.h"
#include "nms_kernels.cuh"

namespace detcore {
namespace {

// Shared by nms and batched_nms: categories is undefined for plain nms.
at::Tensor nms_impl(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& categories,
    double iou_threshold) {
  at::cuda::CUDAGuard device_guard(boxes.device());
  const int64_t n = boxes.size(0);
  if (n == 0) {
    return at::empty({0}, boxes.options().dtype(at::kLong));
  }

  // Stable: equal scores keep the lower index first, as the CPU kernel does.
  const at::Tensor order = std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor sorted_boxes = boxes.index_select(0, order).contiguous();
  at::Tensor sorted_categories;
  if (categories.defined()) {
    sorted_categories = categories.index_select(0, order).contiguous();
  }

  const NmsLaunch launch = nms_launch(n);
  const int64_t col_blocks = launch.col_blocks;
  at::Tensor mask = at::empty({n * col_blocks}, boxes.options().dtype(at::kLong));
  at::Tensor keep = at::empty({n}, boxes.options().dtype(at::kBool));
  auto* mask_ptr = reinterpret_cast<unsigned long long*>(mask.data_ptr<int64_t>());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  const dim3 grid(launch.grid_x, launch.grid_y);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, sorted_boxes.scalar_type(), "detcore_nms_mask_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        nms_mask_kernel<scalar_t, acc_t><<<grid, kBlockBoxes, 0, stream>>>(
            n, col_blocks, sorted_boxes.data_ptr<scalar_t>(),
            categories.defined() ? sorted_categories.data_ptr<int64_t>() : nullptr,
            iou_threshold, mask_ptr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });

  at::Tensor removed_global;
  unsigned long long* removed_ptr = nullptr;
  if (!launch.unwrap_in_shared) {
    removed_global = at::empty({col_blocks}, boxes.options().dtype(at::kLong));
    removed_ptr = reinterpret_cast<unsigned long long*>(removed_global.data_ptr<int64_t>());
  }
  nms_unwrap_kernel<<<1, kUnwrapThreads, launch.unwrap_shared_bytes, stream>>>(
      n, col_blocks, mask_ptr, launch.unwrap_in_shared, removed_ptr, keep.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  return order.masked_select(keep);
}

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_nms_inputs("nms", boxes, scores, iou_threshold);
  return nms_impl(boxes, scores, at::Tensor(), iou_threshold);
}

at::Tensor batched_nms_cuda(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  check_batched_nms_inputs(boxes, scores, idxs, iou_threshold);
  return nms_impl(boxes, scores, category_ids(idxs, value_checks_enabled()), iou_threshold);
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("nms", TORCH_FN(nms_cuda));
  m.impl("batched_nms", TORCH_FN(batched_nms_cuda));
}

}  // namespace detcore
