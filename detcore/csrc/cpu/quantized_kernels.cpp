// nms, batched_nms and roi_align on quantized CPU tensors (quint8, qint8, qint32), which
// torchvision's ops also take. They dequantize, run the float kernels, and (roi_align) quantize
// the result with the input's scale and zero point. torchvision's quantized roi_align sums the
// raw integers and dequantizes the sum, so the two can differ by one quantization step where a
// value falls on a rounding boundary; its roi_align takes only one image per batch, this one any.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../checks.h"
#include "../dispatch.h"

namespace detcore {
namespace {

at::Tensor dequantized(const at::Tensor& t) { return t.is_quantized() ? t.dequantize() : t; }

at::Tensor nms_quantized(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  return call_nms(dequantized(boxes), dequantized(scores), iou_threshold);
}

at::Tensor batched_nms_quantized(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  return call_batched_nms(dequantized(boxes), dequantized(scores), idxs, iou_threshold);
}

at::Tensor roi_align_quantized(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  DETCORE_CHECK_ARG(
      input.is_quantized() && input.qscheme() == at::kPerTensorAffine,
      "roi_align: a quantized input must be quantized per tensor (one scale and zero point), got ",
      input.is_quantized() ? toString(input.qscheme()) : "a float input with quantized rois");
  DETCORE_CHECK_ARG(
      !rois.is_quantized() || rois.qscheme() == at::kPerTensorAffine,
      "roi_align: quantized rois must be quantized per tensor, got ", toString(rois.qscheme()));
  const at::Tensor pooled = call_roi_align(
      input.dequantize(), dequantized(rois).to(at::kFloat), spatial_scale, pooled_height,
      pooled_width, sampling_ratio, aligned);
  return at::quantize_per_tensor(
      pooled, input.q_scale(), input.q_zero_point(), input.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, QuantizedCPU, m) {
  m.impl("nms", TORCH_FN(nms_quantized));
  m.impl("batched_nms", TORCH_FN(batched_nms_quantized));
  m.impl("roi_align", TORCH_FN(roi_align_quantized));
}

}  // namespace detcore
