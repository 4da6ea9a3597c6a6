// The sampling geometry of ROIAlign, shared by the CPU and CUDA kernels so both compute the
// same thing (torchvision's semantics: aligned shifts by half a pixel; unaligned rois are at
// least 1x1; an adaptive grid uses ceil(roi_size / output_size) samples per bin side).
// Products that feed a sum go through rounded_ops.h: fused into an FMA on the GPU, roi * scale -
// offset could round differently and ceil() pick another sample count than on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "float_to_int.h"
#include "rounded_ops.h"

namespace detcore {

// An adaptive grid's samples per bin side are clamped to [0, kRoiAlignMaxGridSide] before the
// conversion to int, so that a huge or non-finite roi (NaN gives 0) converts the same way on
// every device and grid_h * grid_w stays within int. Twice the largest side the argument checks
// let through (checks.h, kMaxSamplesPerBin): no roi they admit has its grid changed.
constexpr int kRoiAlignMaxGridSide = 1 << 15;

// Where one roi's bins lie in feature-map coordinates. T is the accumulation type.
template <typename T>
struct RoiGeometry {
  int64_t batch;
  T start_h, start_w;  // top-left corner of the roi
  T bin_h, bin_w;      // size of one output bin
  int grid_h, grid_w;  // samples per bin along each side
  T count;             // grid_h * grid_w (at least 1): the average's divisor
};

// ceil(roi_size / pooled) samples along one side of each bin, clamped (kRoiAlignMaxGridSide). A
// negative-size aligned roi gives a non-positive count: it samples nothing (output 0).
template <typename T>
DETCORE_HOST_DEVICE int adaptive_grid_side(T roi_size, int64_t pooled) {
  T n = ceil(roi_size / static_cast<T>(pooled));
  n = n < T(0) ? T(0) : (n > T(kRoiAlignMaxGridSide) ? T(kRoiAlignMaxGridSide) : n);
  return float_to_int<int>(n);
}

template <typename T, typename R>
DETCORE_HOST_DEVICE RoiGeometry<T> roi_geometry(
    const R* roi, T spatial_scale, int64_t pooled_height, int64_t pooled_width,
    int64_t sampling_ratio, bool aligned) {
  RoiGeometry<T> g;
  g.batch = float_to_int<int64_t>(static_cast<T>(roi[0]));
  const T offset = aligned ? T(0.5) : T(0);
  g.start_w = sub_rn(mul_rn(static_cast<T>(roi[1]), spatial_scale), offset);
  g.start_h = sub_rn(mul_rn(static_cast<T>(roi[2]), spatial_scale), offset);
  T width = sub_rn(sub_rn(mul_rn(static_cast<T>(roi[3]), spatial_scale), offset), g.start_w);
  T height = sub_rn(sub_rn(mul_rn(static_cast<T>(roi[4]), spatial_scale), offset), g.start_h);
  if (!aligned) {  // legacy behaviour: force malformed rois to be 1x1
    width = width > T(1) ? width : T(1);
    height = height > T(1) ? height : T(1);
  }
  g.bin_h = height / static_cast<T>(pooled_height);
  g.bin_w = width / static_cast<T>(pooled_width);
  g.grid_h = sampling_ratio > 0 ? static_cast<int>(sampling_ratio)
                                : adaptive_grid_side(height, pooled_height);
  g.grid_w = sampling_ratio > 0 ? static_cast<int>(sampling_ratio)
                                : adaptive_grid_side(width, pooled_width);
  const int n = g.grid_h * g.grid_w;
  g.count = static_cast<T>(n > 1 ? n : 1);
  return g;
}

// The four pixels a sample at (y, x) blends and their weights. Samples more than one pixel
// outside the map contribute nothing (valid = false).
template <typename T>
struct BilinearTap {
  int64_t y_low, x_low, y_high, x_high;
  T w1, w2, w3, w4;  // weights of (y_low,x_low), (y_low,x_high), (y_high,x_low), (y_high,x_high)
  bool valid;
};

template <typename T>
DETCORE_HOST_DEVICE BilinearTap<T> bilinear_tap(int64_t height, int64_t width, T y, T x) {
  BilinearTap<T> t;
  if (y < T(-1) || y > static_cast<T>(height) || x < T(-1) || x > static_cast<T>(width)) {
    t.valid = false;
    t.y_low = t.x_low = t.y_high = t.x_high = 0;
    t.w1 = t.w2 = t.w3 = t.w4 = T(0);
    return t;
  }
  t.valid = true;
  if (y <= T(0)) y = T(0);
  if (x <= T(0)) x = T(0);
  t.y_low = float_to_int<int64_t>(y);
  t.x_low = float_to_int<int64_t>(x);
  if (t.y_low >= height - 1) {
    t.y_high = t.y_low = height - 1;
    y = static_cast<T>(t.y_low);
  } else {
    t.y_high = t.y_low + 1;
  }
  if (t.x_low >= width - 1) {
    t.x_high = t.x_low = width - 1;
    x = static_cast<T>(t.x_low);
  } else {
    t.x_high = t.x_low + 1;
  }
  const T ly = y - static_cast<T>(t.y_low);
  const T lx = x - static_cast<T>(t.x_low);
  const T hy = T(1) - ly;
  const T hx = T(1) - lx;
  t.w1 = hy * hx;
  t.w2 = hy * lx;
  t.w3 = ly * hx;
  t.w4 = ly * lx;
  return t;
}

// Coordinate of sample i (of grid samples) inside bin b, along one axis.
template <typename T>
DETCORE_HOST_DEVICE T sample_coordinate(T start, T bin, int64_t b, int i, int grid) {
  return add_rn(
      add_rn(start, mul_rn(static_cast<T>(b), bin)),
      mul_rn(static_cast<T>(i) + T(0.5), bin) / static_cast<T>(grid));
}

}  // namespace detcore
