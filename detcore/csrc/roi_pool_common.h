// The bins of ROIPool (Fast R-CNN's max pooling over quantized bins), shared by the CPU and CUDA
// kernels so that both pool exactly the same pixels. torchvision's semantics: the scaled roi
// corners are rounded to whole pixels (half away from zero), the roi spans end - start + 1 pixels
// (at least 1), bin p covers [floor(p * bin), ceil((p + 1) * bin)) from the roi's corner, clipped
// to the map; an empty bin pools to 0 with argmax -1.
// The products go through rounded_ops.h: fused into an FMA on the GPU they could round
// differently and floor / ceil pick another pixel than on the CPU.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "float_to_int.h"
#include "rounded_ops.h"

namespace detcore {

// Rounded roi corners are clamped to +-2^40 pixels before the conversion to an integer (a huge
// roi coordinate or spatial_scale would otherwise overflow it). Far beyond any real map: every
// bin of such a roi is clipped to the map or empty, as it would be unclamped.
constexpr double kRoiPoolCoordinateLimit = 1099511627776.0;  // 2^40

// The running maximum of a non-empty bin starts here (torchvision's -FLT_MAX, also in float64):
// values at or below it (and NaN) are never picked, and a bin holding only such values gives
// -FLT_MAX with argmax -1.
constexpr float kRoiPoolLowest = -FLT_MAX;

// Where one roi lies on the map, in whole pixels, and its bin size. T is the computation type.
template <typename T>
struct RoiPoolGeometry {
  int64_t batch;
  int64_t start_h, start_w;  // rounded top-left corner of the roi
  T bin_h, bin_w;            // size of one bin, in pixels
};

template <typename T>
DETCORE_HOST_DEVICE int64_t roi_pool_corner(T coordinate, T spatial_scale) {
  T v = round(mul_rn(coordinate, spatial_scale));
  const T limit = static_cast<T>(kRoiPoolCoordinateLimit);
  v = v < -limit ? -limit : (v > limit ? limit : v);
  return float_to_int<int64_t>(v);  // NaN (a non-finite roi) gives 0
}

template <typename T, typename R>
DETCORE_HOST_DEVICE RoiPoolGeometry<T> roi_pool_geometry(
    const R* roi, T spatial_scale, int64_t pooled_height, int64_t pooled_width) {
  RoiPoolGeometry<T> g;
  g.batch = float_to_int<int64_t>(static_cast<T>(roi[0]));
  g.start_w = roi_pool_corner(static_cast<T>(roi[1]), spatial_scale);
  g.start_h = roi_pool_corner(static_cast<T>(roi[2]), spatial_scale);
  const int64_t end_w = roi_pool_corner(static_cast<T>(roi[3]), spatial_scale);
  const int64_t end_h = roi_pool_corner(static_cast<T>(roi[4]), spatial_scale);
  // Malformed (inverted) rois pool a single pixel.
  const int64_t roi_w = end_w - g.start_w + 1 > 1 ? end_w - g.start_w + 1 : 1;
  const int64_t roi_h = end_h - g.start_h + 1 > 1 ? end_h - g.start_h + 1 : 1;
  g.bin_h = static_cast<T>(roi_h) / static_cast<T>(pooled_height);
  g.bin_w = static_cast<T>(roi_w) / static_cast<T>(pooled_width);
  return g;
}

// The half-open pixel range [begin, end) of bin p along one axis, clipped to [0, size).
struct PixelRange {
  int64_t begin, end;
};

template <typename T>
DETCORE_HOST_DEVICE PixelRange roi_pool_bin_range(int64_t start, T bin, int64_t p, int64_t size) {
  int64_t begin = float_to_int<int64_t>(floor(mul_rn(static_cast<T>(p), bin))) + start;
  int64_t end = float_to_int<int64_t>(ceil(mul_rn(static_cast<T>(p + 1), bin))) + start;
  begin = begin < 0 ? 0 : (begin > size ? size : begin);
  end = end < 0 ? 0 : (end > size ? size : end);
  return PixelRange{begin, end};
}

}  // namespace detcore
