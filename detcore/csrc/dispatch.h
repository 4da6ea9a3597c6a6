// Typed calls of detcore's ops through the dispatcher, for kernels (autograd, autocast) that
// re-enter an op below their own dispatch key.
#pragma once

#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace detcore {

inline at::Tensor call_nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::nms", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(boxes, scores, iou_threshold);
}

inline at::Tensor call_batched_nms(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("detcore::batched_nms", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>();
  return op.call(boxes, scores, idxs, iou_threshold);
}

inline at::Tensor call_roi_align(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::roi_align", "")
                       .typed<at::Tensor(
                           const at::Tensor&, const at::Tensor&, double, int64_t, int64_t,
                           int64_t, bool)>();
  return op.call(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
}

inline at::Tensor call_roi_align_backward(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
    c10::SymInt width, int64_t sampling_ratio, bool aligned) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::_roi_align_backward", "")
                       .typed<at::Tensor(
                           const at::Tensor&, const at::Tensor&, double, int64_t, int64_t,
                           c10::SymInt, c10::SymInt, c10::SymInt, c10::SymInt, int64_t, bool)>();
  return op.call(
      grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio, aligned);
}

inline std::tuple<at::Tensor, at::Tensor> call_roi_pool(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::roi_pool", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, double, int64_t, int64_t)>();
  return op.call(input, rois, spatial_scale, pooled_height, pooled_width);
}

inline at::Tensor call_roi_pool_backward(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    double spatial_scale, int64_t pooled_height, int64_t pooled_width, c10::SymInt batch_size,
    c10::SymInt channels, c10::SymInt height, c10::SymInt width) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::_roi_pool_backward", "")
                       .typed<at::Tensor(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                           int64_t, int64_t, c10::SymInt, c10::SymInt, c10::SymInt, c10::SymInt)>();
  return op.call(
      grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels,
      height, width);
}

inline at::Tensor call_deform_conv2d(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::deform_conv2d", "")
                       .typed<at::Tensor(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t)>();
  return op.call(
      input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
      groups, offset_groups);
}

// -> (grad_input, grad_weight, grad_offset, grad_mask, grad_bias)
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
call_deform_conv2d_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
    int64_t offset_groups) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("detcore::_deform_conv2d_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, int64_t,
              int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t)>();
  return op.call(
      grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w, groups, offset_groups);
}

inline at::Tensor call_sigmoid_focal_loss(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::sigmoid_focal_loss", "")
                       .typed<at::Tensor(
                           const at::Tensor&, const at::Tensor&, double, double,
                           c10::string_view)>();
  return op.call(inputs, targets, alpha, gamma, reduction);
}

// -> (grad_inputs, grad_targets)
inline std::tuple<at::Tensor, at::Tensor> call_sigmoid_focal_loss_backward(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detcore::_sigmoid_focal_loss_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                           double, c10::string_view, bool)>();
  return op.call(grad, inputs, targets, alpha, gamma, reduction, targets_grad);
}

}  // namespace detcore
