// Device code of deform_conv2d: the deformable im2col (forward, and the weight gradient), the
// col2im of the input gradient (atomics), and the offset / mask gradients. Grid-stride loops;
// no runtime, no streams, no ATen, so that the host compiler can build it too, under the CUDA
// emulation of the tests (tests/layers/cuda_emulation/).
//
// Each call covers one image. Columns are [C * K, P] (row c * K + k: channel c, kernel tap k;
// P = out_h * out_w positions), so that weight group g's rows are one block for the GEMMs of the
// launcher. T is the tensors' type, A the accumulation type (float for half / bfloat16); the
// columns, their gradient and every gradient buffer are of type A. The sampling geometry comes
// from deform_conv2d_common.h, shared with the CPU kernel.
#pragma once

#include <cstdint>

#include "../deform_conv2d_common.h"
#include "../rounded_ops.h"

namespace detcore {
namespace {  // included by deform_conv2d_kernel.cu alone (and by the emulation's own unit)

struct DeformGeometry {
  int64_t channels, height, width, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t out_w, positions, offset_groups;
};

// Where tap k of output position pos samples, for offset group og.
template <typename T, typename A>
__device__ __forceinline__ DeformSample<A> sample_of(
    const DeformGeometry& g, const T* offset, int64_t og, int64_t k, int64_t pos) {
  const int64_t channel = og * g.kernel_h * g.kernel_w + k;
  const int64_t oy = pos / g.out_w;
  const int64_t ox = pos % g.out_w;
  const int64_t i = k / g.kernel_w;
  const int64_t j = k % g.kernel_w;
  const A y = deform_coordinate<A>(
      oy * g.stride_h - g.pad_h + i * g.dilation_h,
      static_cast<A>(offset[2 * channel * g.positions + pos]));
  const A x = deform_coordinate<A>(
      ox * g.stride_w - g.pad_w + j * g.dilation_w,
      static_cast<A>(offset[(2 * channel + 1) * g.positions + pos]));
  return deform_sample<A>(g.height, g.width, y, x);
}

template <typename A>
__device__ __forceinline__ int64_t corner_pixel(const DeformSample<A>& s, int corner, int64_t width) {
  return (s.y_low + (corner >> 1)) * width + s.x_low + (corner & 1);
}

// columns[c * K + k][pos] = mask * bilinear sample; one thread per (c, pos), looping over taps.
template <typename T, typename A>
__global__ void deform_im2col_kernel(
    int64_t total, const T* __restrict__ input, const T* __restrict__ offset,
    const T* __restrict__ mask, DeformGeometry g, A* __restrict__ columns) {
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t channels_per_og = g.channels / g.offset_groups;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const int64_t pos = index % g.positions;
    const int64_t c = index / g.positions;
    const int64_t og = c / channels_per_og;
    const T* plane = input + c * g.height * g.width;
    for (int64_t k = 0; k < taps; ++k) {
      const DeformSample<A> s = sample_of<T, A>(g, offset, og, k, pos);
      A v[4];
      for (int corner = 0; corner < 4; ++corner) {
        v[corner] = s.valid[corner] ? static_cast<A>(plane[corner_pixel(s, corner, g.width)]) : A(0);
      }
      const A m = mask != nullptr ? static_cast<A>(mask[(og * taps + k) * g.positions + pos]) : A(1);
      columns[(c * taps + k) * g.positions + pos] = mul_rn(m, deform_blend(s.w, v));
    }
  }
}

// grad_input += mask * weight * grad column at each valid corner; one thread per column entry.
// Entries of other taps and positions hit the same pixels: atomics.
template <typename T, typename A>
__global__ void deform_col2im_kernel(
    int64_t total, const A* __restrict__ grad_columns, const T* __restrict__ offset,
    const T* __restrict__ mask, DeformGeometry g, A* __restrict__ grad_input) {
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t channels_per_og = g.channels / g.offset_groups;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const int64_t pos = index % g.positions;
    const int64_t k = (index / g.positions) % taps;
    const int64_t c = index / (g.positions * taps);
    const int64_t og = c / channels_per_og;
    const DeformSample<A> s = sample_of<T, A>(g, offset, og, k, pos);
    if (!s.inside) {
      continue;
    }
    const A m = mask != nullptr ? static_cast<A>(mask[(og * taps + k) * g.positions + pos]) : A(1);
    const A scaled = mul_rn(m, grad_columns[index]);
    A* plane = grad_input + c * g.height * g.width;
    for (int corner = 0; corner < 4; ++corner) {
      if (s.valid[corner]) {
        atomicAdd(plane + corner_pixel(s, corner, g.width), mul_rn(s.w[corner], scaled));
      }
    }
  }
}

// Offset and mask gradients of one (offset group, tap, position); one thread each, summing over
// the offset group's channels: dot[corner] = sum_c grad column * corner value.
template <typename T, typename A>
__global__ void deform_coordinate_grad_kernel(
    int64_t total, const A* __restrict__ grad_columns, const T* __restrict__ input,
    const T* __restrict__ offset, const T* __restrict__ mask, DeformGeometry g,
    A* __restrict__ grad_offset, A* __restrict__ grad_mask) {
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t channels_per_og = g.channels / g.offset_groups;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const int64_t pos = index % g.positions;
    const int64_t k = (index / g.positions) % taps;
    const int64_t og = index / (g.positions * taps);
    const int64_t channel = og * taps + k;  // == index / positions
    const DeformSample<A> s = sample_of<T, A>(g, offset, og, k, pos);
    A dot[4] = {A(0), A(0), A(0), A(0)};
    if (s.inside) {
      for (int64_t c = og * channels_per_og; c < (og + 1) * channels_per_og; ++c) {
        const A gc = grad_columns[(c * taps + k) * g.positions + pos];
        const T* plane = input + c * g.height * g.width;
        for (int corner = 0; corner < 4; ++corner) {
          if (s.valid[corner]) {
            dot[corner] = add_rn(
                dot[corner],
                mul_rn(gc, static_cast<A>(plane[corner_pixel(s, corner, g.width)])));
          }
        }
      }
    }
    A gy = A(0), gx = A(0), gm = A(0);
    if (s.inside) {
      A dwy[4], dwx[4];
      deform_weight_derivatives(s, dwy, dwx);
      for (int corner = 0; corner < 4; ++corner) {
        if (!s.valid[corner]) continue;
        gy = add_rn(gy, mul_rn(dwy[corner], dot[corner]));
        gx = add_rn(gx, mul_rn(dwx[corner], dot[corner]));
        gm = add_rn(gm, mul_rn(s.w[corner], dot[corner]));
      }
    }
    const A m = mask != nullptr ? static_cast<A>(mask[channel * g.positions + pos]) : A(1);
    grad_offset[2 * channel * g.positions + pos] = mul_rn(m, gy);
    grad_offset[(2 * channel + 1) * g.positions + pos] = mul_rn(m, gx);
    if (grad_mask != nullptr) {
      grad_mask[channel * g.positions + pos] = gm;
    }
  }
}

}  // namespace
}  // namespace detcore
