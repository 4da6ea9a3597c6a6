// Argument checks shared by the CPU and CUDA kernels. Each failure names the argument and what
// was expected, and is raised as OpArgumentError (argument_error.h), a Python ValueError and
// RuntimeError: bad input must never reach a kernel.
#pragma once

#include <cmath>
#include <vector>

#include <ATen/ATen.h>

#include "argument_error.h"
#include "roi_align_common.h"

namespace detcore {

// ROIAlign's work per bin is bounded: an explicit sampling ratio up to kMaxSamplingRatio, and an
// adaptive grid (ceil(roi size / output size) per side) of at most kMaxSamplesPerBin samples. A
// huge roi or spatial_scale would otherwise loop for hours, uninterruptibly, or exhaust memory.
constexpr int64_t kMaxSamplingRatio = 128;
constexpr int64_t kMaxSamplesPerBin = kMaxSamplingRatio * kMaxSamplingRatio;
static_assert(
    kMaxSamplesPerBin < kRoiAlignMaxGridSide,
    "the kernels' clamp of an adaptive grid (roi_align_common.h) must change no admitted roi");

// The kernels' floating types (the CUDA ones also take half and bfloat16). Others that pass
// is_floating_point (float8) would fail inside the dtype dispatch with a bare error.
inline bool is_kernel_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

inline void check_nms_inputs(
    const char* op, const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  DETCORE_CHECK_ARG(
      std::isfinite(iou_threshold), op, ": iou_threshold must be a finite number, got ",
      iou_threshold);
  DETCORE_CHECK_ARG(
      boxes.dim() == 2 && boxes.size(1) == 4, op,
      ": boxes must have shape [N, 4] (x1, y1, x2, y2), got ", boxes.sizes());
  DETCORE_CHECK_ARG(scores.dim() == 1, op, ": scores must have shape [N], got ", scores.sizes());
  DETCORE_CHECK_ARG(
      boxes.size(0) == scores.size(0), op, ": boxes and scores must have the same length, got ",
      boxes.size(0), " boxes and ", scores.size(0), " scores");
  DETCORE_CHECK_ARG(
      is_kernel_float(boxes.scalar_type()), op,
      ": boxes must be float32, float64, float16 or bfloat16, got ", boxes.scalar_type());
  DETCORE_CHECK_ARG(
      boxes.scalar_type() == scores.scalar_type(), op,
      ": boxes and scores must have the same dtype, got ", boxes.scalar_type(), " and ",
      scores.scalar_type());
  DETCORE_CHECK_ARG(
      boxes.device() == scores.device(), op, ": boxes and scores must be on the same device, got ",
      boxes.device(), " and ", scores.device());
}

inline void check_batched_nms_inputs(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  check_nms_inputs("batched_nms", boxes, scores, iou_threshold);
  DETCORE_CHECK_ARG(
      idxs.dim() == 1 && idxs.size(0) == boxes.size(0),
      "batched_nms: idxs must have shape [N] matching boxes, got ", idxs.sizes(), " for ",
      boxes.size(0), " boxes");
  DETCORE_CHECK_ARG(
      !idxs.is_complex() && (!idxs.is_floating_point() || is_kernel_float(idxs.scalar_type())),
      "batched_nms: idxs must be a tensor of integer, bool or floating category ids, got ",
      idxs.scalar_type());
  DETCORE_CHECK_ARG(
      idxs.device() == boxes.device(), "batched_nms: idxs must be on the device of boxes, got ",
      idxs.device(), " and ", boxes.device());
}

// batched_nms's category ids as int64, the kernels' type. Floating ids, which torchvision accepts,
// are numbered by value (equal values, one category); NaN or infinite ones are refused, unless
// check_values is false (value_checks.h). Bool ids are categories 0 and 1. Integer ids cost no
// sync on a GPU; floating ones cost the check's and _unique2's.
inline at::Tensor category_ids(const at::Tensor& idxs, bool check_values = true) {
  if (!idxs.is_floating_point()) {
    return idxs.to(at::kLong);
  }
  DETCORE_CHECK_ARG(
      !check_values || at::isfinite(idxs).all().item<bool>(),
      "batched_nms: floating category ids (idxs) must be finite, got NaN or infinite values");
  return std::get<1>(at::_unique2(idxs, /*sorted=*/true, /*return_inverse=*/true));
}

inline void check_roi_align_common(
    const char* op, const at::Tensor& values, const at::Tensor& rois, double spatial_scale,
    int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio) {
  DETCORE_CHECK_ARG(
      rois.dim() == 2 && rois.size(1) == 5, op,
      ": rois must have shape [K, 5] (batch_index, x1, y1, x2, y2), got ", rois.sizes());
  DETCORE_CHECK_ARG(
      is_kernel_float(values.scalar_type()), op,
      ": input must be float32, float64, float16 or bfloat16, got ", values.scalar_type());
  DETCORE_CHECK_ARG(
      rois.scalar_type() == values.scalar_type(), op,
      ": rois must have the dtype of input, got ", rois.scalar_type(), " and ",
      values.scalar_type());
  DETCORE_CHECK_ARG(
      rois.device() == values.device(), op, ": rois must be on the device of input, got ",
      rois.device(), " and ", values.device());
  DETCORE_CHECK_ARG(
      pooled_height >= 0 && pooled_width >= 0, op,
      ": output_size must be non-negative, got (", pooled_height, ", ", pooled_width, ")");
  DETCORE_CHECK_ARG(
      sampling_ratio <= kMaxSamplingRatio, op, ": sampling_ratio must be at most ",
      kMaxSamplingRatio, " samples per bin side (<= 0: adaptive), got ", sampling_ratio);
  DETCORE_CHECK_ARG(
      std::isfinite(spatial_scale) && spatial_scale > 0, op,
      ": spatial_scale must be a finite number > 0, got ", spatial_scale);
}

// What every roi check needs, computed where the rois (as double, `r`) live: the smallest and
// largest batch index and the number of non-finite values. A caller appends its own values and
// brings them all to the host in one transfer (one sync on CUDA), then calls check_roi_summary.
inline std::vector<at::Tensor> roi_summary(const at::Tensor& r) {
  auto bounds = at::aminmax(r.select(1, 0));
  return {std::get<0>(bounds), std::get<1>(bounds), (~at::isfinite(r)).sum().to(at::kDouble)};
}

// Every roi must be finite and its batch index name an image of the input (a bad one would read
// out of bounds). `v` holds roi_summary's three values, on the host.
inline void check_roi_summary(const char* op, const double* v, int64_t batch_size) {
  DETCORE_CHECK_ARG(
      v[2] == 0, op, ": rois must be finite, got ", static_cast<int64_t>(v[2]),
      " NaN or infinite value(s)");
  DETCORE_CHECK_ARG(
      v[0] >= 0 && v[1] < static_cast<double>(batch_size), op,
      ": rois[:, 0] must be batch indices in [0, ", batch_size, "), got values in [", v[0], ", ",
      v[1], "]");
}

// The roi checks above, and an adaptive sampling grid within kMaxSamplesPerBin. Returns the
// largest number of samples per bin (for the CPU backward to size its work).
inline int64_t check_rois(
    const char* op, const at::Tensor& rois, int64_t batch_size, double spatial_scale,
    int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  if (rois.size(0) == 0) {
    return 0;
  }
  auto r = rois.to(at::kDouble);
  auto geometry = r.narrow(1, 1, 4);
  at::Tensor samples;
  if (sampling_ratio > 0 || pooled_height == 0 || pooled_width == 0) {  // no bins: no samples
    samples = at::zeros({}, r.options());
  } else {
    const double offset = aligned ? 0.5 : 0.0;
    auto scaled = at::nan_to_num(geometry, 0, 0, 0) * spatial_scale - offset;
    auto width = scaled.select(1, 2) - scaled.select(1, 0);
    auto height = scaled.select(1, 3) - scaled.select(1, 1);
    if (!aligned) {
      width = width.clamp_min(1);
      height = height.clamp_min(1);
    }
    auto grid_w = at::ceil(width / static_cast<double>(pooled_width)).clamp_min(0);
    auto grid_h = at::ceil(height / static_cast<double>(pooled_height)).clamp_min(0);
    samples = (grid_w * grid_h).max();
  }
  auto parts = roi_summary(r);
  parts.push_back(samples);
  const auto summary = at::stack(parts).cpu();
  const double* v = summary.data_ptr<double>();
  check_roi_summary(op, v, batch_size);
  DETCORE_CHECK_ARG(
      v[3] <= static_cast<double>(kMaxSamplesPerBin), op, ": with adaptive sampling a roi of ",
      "these rois would take ", v[3], " samples per output bin (at most ", kMaxSamplesPerBin,
      " are allowed); check the rois and spatial_scale (", spatial_scale,
      "), or pass a sampling_ratio in 1..", kMaxSamplingRatio);
  return sampling_ratio > 0 ? sampling_ratio * sampling_ratio : static_cast<int64_t>(v[3]);
}

// The checks of an op with rois. With read_values false (a CUDA launcher on the unchecked path,
// value_checks.h) the rois' values are not read (check_rois is skipped) and 0 is returned.
inline int64_t check_roi_align_inputs(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned, bool read_values = true) {
  DETCORE_CHECK_ARG(
      input.dim() == 4, "roi_align: input must have shape [N, C, H, W], got ", input.sizes());
  check_roi_align_common(
      "roi_align", input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio);
  if (!read_values) {
    return 0;
  }
  return check_rois(
      "roi_align", rois, input.size(0), spatial_scale, pooled_height, pooled_width, sampling_ratio,
      aligned);
}

inline int64_t check_roi_align_backward_inputs(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned, bool read_values = true) {
  DETCORE_CHECK_ARG(
      batch_size >= 0 && channels >= 0 && height >= 0 && width >= 0,
      "roi_align backward: the input shape must be non-negative, got [", batch_size, ", ",
      channels, ", ", height, ", ", width, "]");
  DETCORE_CHECK_ARG(
      grad.dim() == 4 && grad.size(0) == rois.size(0) && grad.size(2) == pooled_height &&
          grad.size(3) == pooled_width,
      "roi_align backward: grad must have shape [K, C, ", pooled_height, ", ", pooled_width,
      "] with K = number of rois (", rois.size(0), "), got ", grad.sizes());
  DETCORE_CHECK_ARG(
      grad.size(1) == channels, "roi_align backward: grad has ", grad.size(1),
      " channels but the input had ", channels);
  check_roi_align_common(
      "roi_align backward", grad, rois, spatial_scale, pooled_height, pooled_width,
      sampling_ratio);
  if (!read_values) {
    return 0;
  }
  return check_rois(
      "roi_align backward", rois, batch_size, spatial_scale, pooled_height, pooled_width,
      sampling_ratio, aligned);
}

// ROIPool's argmax holds offsets into one H * W plane as int32 (as torchvision's), so a plane
// may have at most this many pixels.
constexpr int64_t kMaxRoiPoolPlane = 2147483647;

inline void check_roi_pool_plane(const char* op, int64_t height, int64_t width) {
  DETCORE_CHECK_ARG(
      height * width <= kMaxRoiPoolPlane, op, ": the input's H * W must be at most ",
      kMaxRoiPoolPlane, " (argmax holds int32 offsets), got ", height, " * ", width);
}

inline void check_roi_pool_inputs(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, bool read_values = true) {
  DETCORE_CHECK_ARG(
      input.dim() == 4, "roi_pool: input must have shape [N, C, H, W], got ", input.sizes());
  // roi_align's checks of rois, dtypes, devices, output_size and spatial_scale (no sampling).
  check_roi_align_common("roi_pool", input, rois, spatial_scale, pooled_height, pooled_width, 0);
  check_roi_pool_plane("roi_pool", input.size(2), input.size(3));
  if (!read_values) {
    return;
  }
  check_rois("roi_pool", rois, input.size(0), spatial_scale, pooled_height, pooled_width, 1, false);
}

// The backward also reads argmax, whose offsets say where each gradient lands: each must be -1
// (nothing pooled) or a pixel of the plane. Checked with the rois in one transfer to the host,
// unless read_values is false (as for check_roi_align_inputs).
inline void check_roi_pool_backward_inputs(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    double spatial_scale, int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
    int64_t channels, int64_t height, int64_t width, bool read_values = true) {
  const char* op = "roi_pool backward";
  DETCORE_CHECK_ARG(
      batch_size >= 0 && channels >= 0 && height >= 0 && width >= 0, op,
      ": the input shape must be non-negative, got [", batch_size, ", ", channels, ", ", height,
      ", ", width, "]");
  DETCORE_CHECK_ARG(
      grad.dim() == 4 && grad.size(0) == rois.size(0) && grad.size(2) == pooled_height &&
          grad.size(3) == pooled_width,
      op, ": grad must have shape [K, C, ", pooled_height, ", ", pooled_width,
      "] with K = number of rois (", rois.size(0), "), got ", grad.sizes());
  DETCORE_CHECK_ARG(
      grad.size(1) == channels, op, ": grad has ", grad.size(1), " channels but the input had ",
      channels);
  check_roi_align_common(op, grad, rois, spatial_scale, pooled_height, pooled_width, 0);
  DETCORE_CHECK_ARG(
      argmax.scalar_type() == at::kInt, op, ": argmax must be int32 (roi_pool's second output), got ",
      argmax.scalar_type());
  DETCORE_CHECK_ARG(
      argmax.sizes() == grad.sizes(), op, ": argmax must have the shape of grad ", grad.sizes(),
      ", got ", argmax.sizes());
  DETCORE_CHECK_ARG(
      argmax.device() == grad.device(), op, ": argmax must be on the device of grad, got ",
      argmax.device(), " and ", grad.device());
  check_roi_pool_plane(op, height, width);
  if (!read_values || rois.size(0) == 0) {
    return;
  }
  auto r = rois.to(at::kDouble);
  at::Tensor lowest, highest;
  if (argmax.numel() > 0 && argmax.is_cpu()) {
    // A plain loop: ATen's parallel reduction wakes every thread for a small tensor, which on a
    // busy machine costs more than the whole backward.
    const at::Tensor a = argmax.contiguous();
    const int32_t* v = a.data_ptr<int32_t>();
    int32_t lo = v[0], hi = v[0];
    for (int64_t i = 1; i < a.numel(); ++i) {
      lo = v[i] < lo ? v[i] : lo;
      hi = v[i] > hi ? v[i] : hi;
    }
    lowest = at::full({}, static_cast<double>(lo), r.options());
    highest = at::full({}, static_cast<double>(hi), r.options());
  } else if (argmax.numel() > 0) {
    auto a = at::aminmax(argmax);
    lowest = std::get<0>(a).to(at::kDouble);
    highest = std::get<1>(a).to(at::kDouble);
  } else {
    lowest = highest = at::full({}, -1.0, r.options());
  }
  auto parts = roi_summary(r);
  parts.push_back(lowest);
  parts.push_back(highest);
  const auto summary = at::stack(parts).cpu();
  const double* v = summary.data_ptr<double>();
  check_roi_summary(op, v, batch_size);
  DETCORE_CHECK_ARG(
      v[3] >= -1 && v[4] < static_cast<double>(height * width), op,
      ": argmax must hold offsets into the H * W plane, in [-1, ", height * width,
      "), got values in [", static_cast<int64_t>(v[3]), ", ", static_cast<int64_t>(v[4]), "]");
}

// Deformable convolution: the shapes of every argument against input [N, C, H, W] and weight
// [O, C / groups, kh, kw]. Returns the output's spatial size {out_h, out_w}.
struct DeformConvShape {
  int64_t batch, in_channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t out_h, out_w;
};

inline void check_deform_same(
    const char* op, const char* name, const at::Tensor& t, const at::Tensor& input) {
  DETCORE_CHECK_ARG(
      t.scalar_type() == input.scalar_type(), op, ": ", name, " must have the dtype of input (",
      input.scalar_type(), "), got ", t.scalar_type());
  DETCORE_CHECK_ARG(
      t.device() == input.device(), op, ": ", name, " must be on the device of input (",
      input.device(), "), got ", t.device());
}

inline DeformConvShape check_deform_conv2d_inputs(
    const char* op, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  DETCORE_CHECK_ARG(
      input.dim() == 4, op, ": input must have shape [N, C, H, W], got ", input.sizes());
  DETCORE_CHECK_ARG(
      is_kernel_float(input.scalar_type()), op,
      ": input must be float32, float64, float16 or bfloat16, got ", input.scalar_type());
  DETCORE_CHECK_ARG(
      weight.dim() == 4, op, ": weight must have shape [out_channels, in_channels / groups, ",
      "kernel_h, kernel_w], got ", weight.sizes());
  DETCORE_CHECK_ARG(
      offset.dim() == 4, op, ": the shape of the offset is not valid: offset must have shape ",
      "[N, 2 * offset_groups * kernel_h * kernel_w, out_h, out_w], got ", offset.sizes());
  check_deform_same(op, "weight", weight, input);
  check_deform_same(op, "offset", offset, input);
  DETCORE_CHECK_ARG(
      stride_h > 0 && stride_w > 0, op, ": stride must be positive, got (", stride_h, ", ",
      stride_w, ")");
  DETCORE_CHECK_ARG(
      pad_h >= 0 && pad_w >= 0, op, ": padding must be non-negative, got (", pad_h, ", ", pad_w,
      ")");
  DETCORE_CHECK_ARG(
      dilation_h > 0 && dilation_w > 0, op, ": dilation must be positive, got (", dilation_h,
      ", ", dilation_w, ")");
  DeformConvShape s{};
  s.batch = input.size(0);
  s.in_channels = input.size(1);
  s.height = input.size(2);
  s.width = input.size(3);
  s.out_channels = weight.size(0);
  s.kernel_h = weight.size(2);
  s.kernel_w = weight.size(3);
  DETCORE_CHECK_ARG(
      s.kernel_h > 0 && s.kernel_w > 0, op, ": weight's kernel size must be positive, got ",
      weight.sizes());
  DETCORE_CHECK_ARG(
      groups > 0 && weight.size(1) > 0 && s.in_channels % groups == 0 &&
          weight.size(1) * groups == s.in_channels,
      op, ": weight.shape[1] (", weight.size(1), ") times groups (", groups,
      ") must equal input's channels (", s.in_channels, ")");
  DETCORE_CHECK_ARG(
      s.out_channels % groups == 0, op, ": weight.shape[0] (out_channels, ", s.out_channels,
      ") must be divisible by groups (", groups, ")");
  DETCORE_CHECK_ARG(
      offset_groups > 0 && s.in_channels % offset_groups == 0, op,
      ": input's channels (", s.in_channels, ") must be divisible by offset_groups (",
      offset_groups, ")");
  const int64_t taps = s.kernel_h * s.kernel_w;
  s.out_h = (s.height + 2 * pad_h - (dilation_h * (s.kernel_h - 1) + 1)) / stride_h + 1;
  s.out_w = (s.width + 2 * pad_w - (dilation_w * (s.kernel_w - 1) + 1)) / stride_w + 1;
  DETCORE_CHECK_ARG(
      s.height + 2 * pad_h >= dilation_h * (s.kernel_h - 1) + 1 &&
          s.width + 2 * pad_w >= dilation_w * (s.kernel_w - 1) + 1 && s.out_h > 0 &&
          s.out_w > 0,
      op, ": the output would be empty: input ", s.height, "x", s.width, " with padding (", pad_h,
      ", ", pad_w, "), dilation (", dilation_h, ", ", dilation_w, ") and a ", s.kernel_h, "x",
      s.kernel_w, " kernel");
  DETCORE_CHECK_ARG(
      offset.size(0) == s.batch && offset.size(1) == 2 * offset_groups * taps &&
          offset.size(2) == s.out_h && offset.size(3) == s.out_w,
      op, ": the shape of the offset is not valid: offset must have shape [", s.batch, ", ",
      2 * offset_groups * taps, ", ", s.out_h, ", ", s.out_w,
      "] (N, 2 * offset_groups * kernel_h * kernel_w, out_h, out_w), got ", offset.sizes());
  if (mask.has_value() && mask->defined()) {
    check_deform_same(op, "mask", *mask, input);
    // torchvision's words (its tests match them) for a mask of the wrong channel count.
    const bool channels_wrong = mask->dim() >= 2 && mask->size(1) != offset_groups * taps;
    DETCORE_CHECK_ARG(
        mask->dim() == 4 && mask->size(0) == s.batch && !channels_wrong &&
            mask->size(2) == s.out_h && mask->size(3) == s.out_w,
        op, ": the shape of the mask is not valid",
        channels_wrong ? " (mask.shape[1] is not valid)" : "",
        ": mask must have shape [", s.batch, ", ", offset_groups * taps, ", ", s.out_h, ", ",
        s.out_w, "] (N, offset_groups * kernel_h * kernel_w, out_h, out_w), got ",
        mask->sizes());
  }
  if (bias.has_value() && bias->defined()) {
    check_deform_same(op, "bias", *bias, input);
    DETCORE_CHECK_ARG(
        bias->dim() == 1 && bias->size(0) == s.out_channels, op, ": bias must have shape [",
        s.out_channels, "] (out_channels), got ", bias->sizes());
  }
  return s;
}

inline DeformConvShape check_deform_conv2d_backward_inputs(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
    int64_t offset_groups) {
  const char* op = "deform_conv2d backward";
  const DeformConvShape s = check_deform_conv2d_inputs(
      op, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w, groups, offset_groups);
  DETCORE_CHECK_ARG(
      grad.dim() == 4 && grad.size(0) == s.batch && grad.size(1) == s.out_channels &&
          grad.size(2) == s.out_h && grad.size(3) == s.out_w,
      op, ": grad must have shape [", s.batch, ", ", s.out_channels, ", ", s.out_h, ", ", s.out_w,
      "], got ", grad.sizes());
  check_deform_same(op, "grad", grad, input);
  return s;
}

enum class FocalReduction : int { kNone = 0, kMean = 1, kSum = 2 };

// Sigmoid focal loss: inputs (logits) and targets of one shape, dtype and device; alpha in
// [0, 1] or negative (no alpha weighting: torchvision's -1); gamma >= 0. Returns the reduction.
inline FocalReduction check_sigmoid_focal_loss_inputs(
    const char* op, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction) {
  DETCORE_CHECK_ARG(
      is_kernel_float(inputs.scalar_type()), op,
      ": inputs must be float32, float64, float16 or bfloat16 logits, got ", inputs.scalar_type());
  DETCORE_CHECK_ARG(
      targets.scalar_type() == inputs.scalar_type(), op,
      ": targets must have the dtype of inputs (", inputs.scalar_type(), "), got ",
      targets.scalar_type());
  DETCORE_CHECK_ARG(
      targets.device() == inputs.device(), op, ": targets must be on the device of inputs (",
      inputs.device(), "), got ", targets.device());
  DETCORE_CHECK_ARG(
      targets.sizes() == inputs.sizes(), op,
      ": targets must have the shape of inputs, got inputs ", inputs.sizes(), " and targets ",
      targets.sizes());
  DETCORE_CHECK_ARG(
      std::isfinite(alpha) && alpha <= 1, op,
      ": alpha must be in [0, 1], or negative for no alpha weighting (torchvision: -1), got ",
      alpha);
  DETCORE_CHECK_ARG(
      std::isfinite(gamma) && gamma >= 0, op, ": gamma must be a finite number >= 0, got ",
      gamma);
  if (reduction == "none") return FocalReduction::kNone;
  if (reduction == "mean") return FocalReduction::kMean;
  // "Invalid" as torchvision's ValueError says it (its tests match the word).
  DETCORE_CHECK_ARG(
      reduction == "sum", op, ": Invalid value for reduction: it must be 'none', 'mean' or 'sum', ",
      "got '", reduction, "'");
  return FocalReduction::kSum;
}

// The backward's grad: the loss's shape for reduction 'none', a scalar ([]) otherwise.
inline FocalReduction check_sigmoid_focal_loss_backward_inputs(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction) {
  const char* op = "sigmoid_focal_loss backward";
  const FocalReduction r =
      check_sigmoid_focal_loss_inputs(op, inputs, targets, alpha, gamma, reduction);
  if (r == FocalReduction::kNone) {
    DETCORE_CHECK_ARG(
        grad.sizes() == inputs.sizes(), op,
        ": grad must have the shape of inputs for reduction 'none', got ", grad.sizes(),
        " and inputs ", inputs.sizes());
  } else {
    DETCORE_CHECK_ARG(
        grad.dim() == 0, op, ": grad must be a scalar ([]) for reduction '", reduction,
        "', got shape ", grad.sizes());
  }
  DETCORE_CHECK_ARG(
      grad.scalar_type() == inputs.scalar_type(), op, ": grad must have the dtype of inputs (",
      inputs.scalar_type(), "), got ", grad.scalar_type());
  DETCORE_CHECK_ARG(
      grad.device() == inputs.device(), op, ": grad must be on the device of inputs (",
      inputs.device(), "), got ", grad.device());
  return r;
}

// The kernels look at every target as they go (no extra pass) and report the first one, in
// memory order, that is not a probability; `index` is its offset in the contiguous targets,
// `value` the target (NaN included). Raises naming the element as targets[i, j, ...].
inline void throw_bad_focal_target(
    const char* op, at::IntArrayRef sizes, int64_t index, double value) {
  std::vector<int64_t> position(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    position[d] = sizes[d] > 0 ? index % sizes[d] : 0;
    index = sizes[d] > 0 ? index / sizes[d] : 0;
  }
  DETCORE_CHECK_ARG(
      false, op, ": targets must be probabilities in [0, 1], got ", value, " at targets",
      at::IntArrayRef(position));
}

}  // namespace detcore
