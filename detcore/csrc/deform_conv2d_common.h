// The sampling geometry of deformable convolution, shared by the CPU and CUDA kernels so both
// sample the same points with the same weights (torchvision's semantics).
//
// Kernel tap (i, j) of output position (oy, ox) reads the input at
//   y = oy * stride_h - pad_h + i * dilation_h + offset_y,  x likewise,
// blending the four pixels around (y, x) bilinearly. A pixel outside the map reads as 0, so a
// point at or beyond one pixel outside (y <= -1, y >= height, ...) reads 0. The derivatives with
// respect to the point are the blend's on the point's cell [floor(y), floor(y) + 1) x [floor(x),
// floor(x) + 1): at an integer coordinate, where the blend has a kink, the right derivative. So
// also at the border: a point exactly at -1 (a zero offset over the padding, as a freshly
// initialised offset conv gives) has the slope towards the map, as in torchvision (mmcv gives 0
// there); a point at height or width, or below -1, has none (its cell lies off the map).
// Offsets are laid out per offset group as (y, x) pairs for taps in row-major order: channel
// 2 * (i * kw + j) is tap (i, j)'s y offset, the next its x offset; the mask has one channel per
// tap. The products of the bilinear blend go through rounded_ops.h, so that nvcc cannot fuse
// them into FMAs and round differently than the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "float_to_int.h"
#include "rounded_ops.h"

namespace detcore {

// The four pixels around one sampling point. A corner outside the map has valid[k] = false
// (its weight is still the bilinear one: it multiplies a value of 0).
template <typename T>
struct DeformSample {
  bool inside;          // the cell touches the map: y in [-1, height), x in [-1, width);
                        // otherwise everything is 0
  int64_t y_low, x_low;  // floor of the point; the other corners are +1
  T ly, lx;             // distance from (y_low, x_low), in [0, 1)
  bool valid[4];        // (y_low,x_low), (y_low,x_high), (y_high,x_low), (y_high,x_high)
  T w[4];               // bilinear weights of those corners
};

// The sampling point of one kernel tap: base is the tap's integer position, oy * stride - pad +
// i * dilation, exact in any floating type used here.
template <typename T>
DETCORE_HOST_DEVICE T deform_coordinate(int64_t base, T offset) {
  return add_rn(static_cast<T>(base), offset);
}

template <typename T>
DETCORE_HOST_DEVICE DeformSample<T> deform_sample(int64_t height, int64_t width, T y, T x) {
  DeformSample<T> s;
  // At -1 exactly the corners on the map have weight 0 (the value is 0) but a slope.
  s.inside = y >= T(-1) && y < static_cast<T>(height) && x >= T(-1) && x < static_cast<T>(width);
  if (!s.inside) {  // also NaN offsets: nothing is sampled
    s.y_low = s.x_low = 0;
    s.ly = s.lx = T(0);
    for (int k = 0; k < 4; ++k) {
      s.valid[k] = false;
      s.w[k] = T(0);
    }
    return s;
  }
  const T fy = floor(y);
  const T fx = floor(x);
  s.y_low = float_to_int<int64_t>(fy);
  s.x_low = float_to_int<int64_t>(fx);
  s.ly = sub_rn(y, fy);
  s.lx = sub_rn(x, fx);
  const T hy = sub_rn(T(1), s.ly);
  const T hx = sub_rn(T(1), s.lx);
  const bool y_low_ok = s.y_low >= 0;
  const bool x_low_ok = s.x_low >= 0;
  const bool y_high_ok = s.y_low + 1 <= height - 1;
  const bool x_high_ok = s.x_low + 1 <= width - 1;
  s.valid[0] = y_low_ok && x_low_ok;
  s.valid[1] = y_low_ok && x_high_ok;
  s.valid[2] = y_high_ok && x_low_ok;
  s.valid[3] = y_high_ok && x_high_ok;
  s.w[0] = mul_rn(hy, hx);
  s.w[1] = mul_rn(hy, s.lx);
  s.w[2] = mul_rn(s.ly, hx);
  s.w[3] = mul_rn(s.ly, s.lx);
  return s;
}

// d(weight of corner k) / dy and / dx, for the offset gradients.
template <typename T>
DETCORE_HOST_DEVICE void deform_weight_derivatives(const DeformSample<T>& s, T dwy[4], T dwx[4]) {
  const T hy = sub_rn(T(1), s.ly);
  const T hx = sub_rn(T(1), s.lx);
  dwy[0] = -hx;
  dwy[1] = -s.lx;
  dwy[2] = hx;
  dwy[3] = s.lx;
  dwx[0] = -hy;
  dwx[1] = hy;
  dwx[2] = -s.ly;
  dwx[3] = s.ly;
}

// Blend of the four corner values v[k] (0 for invalid corners), rounded op by op:
// ((w0 v0 + w1 v1) + w2 v2) + w3 v3.
template <typename T>
DETCORE_HOST_DEVICE T deform_blend(const T w[4], const T v[4]) {
  return add_rn(
      add_rn(add_rn(mul_rn(w[0], v[0]), mul_rn(w[1], v[1])), mul_rn(w[2], v[2])),
      mul_rn(w[3], v[3]));
}

}  // namespace detcore
