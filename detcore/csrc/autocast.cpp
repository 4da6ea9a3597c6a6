// Autocast kernels: under torch.autocast the ops run in float32 (ROIAlign in half precision
// loses too much, and the CPU kernels take float32/float64 only), and return the input's dtype
// (the focal loss: float32).
#include <tuple>

#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "dispatch.h"

namespace detcore {
namespace {

template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor roi_align_autocast(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return call_roi_align(
             at::autocast::cached_cast(at::kFloat, input, device),
             at::autocast::cached_cast(at::kFloat, rois, device), spatial_scale, pooled_height,
             pooled_width, sampling_ratio, aligned)
      .to(input.scalar_type());
}

// ROIPool's max is exact in any precision, but its rois are not: float32 rounds the scaled
// corners as the float32 op does. The pooled values come back in the input's dtype.
template <c10::DispatchKey key, c10::DeviceType device>
std::tuple<at::Tensor, at::Tensor> roi_pool_autocast(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  auto [output, argmax] = call_roi_pool(
      at::autocast::cached_cast(at::kFloat, input, device),
      at::autocast::cached_cast(at::kFloat, rois, device), spatial_scale, pooled_height,
      pooled_width);
  return {output.to(input.scalar_type()), argmax};
}

template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor nms_autocast(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return call_nms(
      at::autocast::cached_cast(at::kFloat, boxes, device),
      at::autocast::cached_cast(at::kFloat, scores, device), iou_threshold);
}

template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor batched_nms_autocast(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return call_batched_nms(
      at::autocast::cached_cast(at::kFloat, boxes, device),
      at::autocast::cached_cast(at::kFloat, scores, device), idxs, iou_threshold);
}

c10::optional<at::Tensor> cast_optional(
    const c10::optional<at::Tensor>& t, c10::DeviceType device) {
  if (!t.has_value() || !t->defined()) return c10::nullopt;
  return at::autocast::cached_cast(at::kFloat, *t, device);
}

template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor deform_conv2d_autocast(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return call_deform_conv2d(
             at::autocast::cached_cast(at::kFloat, input, device),
             at::autocast::cached_cast(at::kFloat, weight, device),
             at::autocast::cached_cast(at::kFloat, offset, device), cast_optional(mask, device),
             cast_optional(bias, device), stride_h, stride_w, pad_h, pad_w, dilation_h,
             dilation_w, groups, offset_groups)
      .to(input.scalar_type());
}

// The loss in float32, returned in float32 (as autocast runs binary_cross_entropy_with_logits,
// and so torchvision's focal loss): a sum over many anchors would lose too much in half.
template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor sigmoid_focal_loss_autocast(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return call_sigmoid_focal_loss(
      at::autocast::cached_cast(at::kFloat, inputs, device),
      at::autocast::cached_cast(at::kFloat, targets, device), alpha, gamma, reduction);
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, Autocast, m) {
  constexpr auto key = c10::DispatchKey::Autocast;
  constexpr auto dev = c10::DeviceType::CUDA;
  m.impl("roi_align", TORCH_FN((roi_align_autocast<key, dev>)));
  m.impl("roi_pool", TORCH_FN((roi_pool_autocast<key, dev>)));
  m.impl("nms", TORCH_FN((nms_autocast<key, dev>)));
  m.impl("batched_nms", TORCH_FN((batched_nms_autocast<key, dev>)));
  m.impl("deform_conv2d", TORCH_FN((deform_conv2d_autocast<key, dev>)));
  m.impl("sigmoid_focal_loss", TORCH_FN((sigmoid_focal_loss_autocast<key, dev>)));
}

TORCH_LIBRARY_IMPL(detcore, AutocastCPU, m) {
  constexpr auto key = c10::DispatchKey::AutocastCPU;
  constexpr auto dev = c10::DeviceType::CPU;
  m.impl("roi_align", TORCH_FN((roi_align_autocast<key, dev>)));
  m.impl("roi_pool", TORCH_FN((roi_pool_autocast<key, dev>)));
  m.impl("nms", TORCH_FN((nms_autocast<key, dev>)));
  m.impl("batched_nms", TORCH_FN((batched_nms_autocast<key, dev>)));
  m.impl("deform_conv2d", TORCH_FN((deform_conv2d_autocast<key, dev>)));
  m.impl("sigmoid_focal_loss", TORCH_FN((sigmoid_focal_loss_autocast<key, dev>)));
}

}  // namespace detcore
