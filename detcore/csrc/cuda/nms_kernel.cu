// Launchers of nms and batched_nms: the argument checks, the category ids and the device; the
// buffers and launches are nms_launch.h's (shared with the CUDA emulation of the tests), the
// kernels nms_kernels.cuh's.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../checks.h"
#include "../value_checks.h"
#include "cuda_launch.h"
#include "nms_launch.h"

namespace detcore {
namespace {

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_nms_inputs("nms", boxes, scores, iou_threshold);
  at::cuda::CUDAGuard device_guard(boxes.device());
  return nms_kept_launch(boxes, scores, at::Tensor(), iou_threshold, CudaLaunch{});
}

at::Tensor batched_nms_cuda(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  check_batched_nms_inputs(boxes, scores, idxs, iou_threshold);
  at::cuda::CUDAGuard device_guard(boxes.device());
  return nms_kept_launch(
      boxes, scores, category_ids(idxs, value_checks_enabled()), iou_threshold, CudaLaunch{});
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("nms", TORCH_FN(nms_cuda));
  m.impl("batched_nms", TORCH_FN(batched_nms_cuda));
}

}  // namespace detcore
