// Device code of roi_align and its backward, one thread per output (pooled) element, in
// grid-stride loops. No runtime, no streams, no ATen, so that the host compiler can build it
// too, under the CUDA emulation of the tests (tests/layers/cuda_emulation/).
//
// The sampling geometry comes from roi_align_common.h, shared with the CPU kernel, so both
// devices sample the same points with the same weights. T is the tensors' type, A the type sums
// are taken in (float for half / bfloat16); the backward scatters into a zeroed buffer of type
// A with atomics, so half gradients lose nothing to half-precision adds.
#pragma once

#include <cstdint>

#include "../roi_align_common.h"
#include "../rounded_ops.h"
#include "roi_guard.h"

namespace detcore {
namespace {  // included by roi_align_kernel.cu alone (and by the emulation's own translation unit)

// Which pooled element a flat index names, for an output of shape [K, C, ph, pw].
struct PooledIndex {
  int64_t k, c, ph, pw;
};

__device__ __forceinline__ PooledIndex unflatten(
    int64_t index, int64_t channels, int64_t pooled_height, int64_t pooled_width) {
  PooledIndex p;
  p.pw = index % pooled_width;
  index /= pooled_width;
  p.ph = index % pooled_height;
  index /= pooled_height;
  p.c = index % channels;
  p.k = index / channels;
  return p;
}

template <typename T, typename A>
__global__ void roi_align_forward_kernel(
    int64_t total, const T* __restrict__ input, const T* __restrict__ rois, A spatial_scale,
    int64_t batch_size, int64_t channels, int64_t height, int64_t width, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned, T* __restrict__ output) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const PooledIndex p = unflatten(index, channels, pooled_height, pooled_width);
    if (!roi_usable<A>(rois + p.k * 5, batch_size)) {
      output[index] = T(0);
      continue;
    }
    const RoiGeometry<A> g = roi_geometry<A>(
        rois + p.k * 5, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
    const T* plane = input + (g.batch * channels + p.c) * height * width;

    A sum = A(0);
    for (int iy = 0; iy < g.grid_h; ++iy) {
      const A y = sample_coordinate(g.start_h, g.bin_h, p.ph, iy, g.grid_h);
      for (int ix = 0; ix < g.grid_w; ++ix) {
        const A x = sample_coordinate(g.start_w, g.bin_w, p.pw, ix, g.grid_w);
        const BilinearTap<A> tap = bilinear_tap(height, width, y, x);
        if (!tap.valid) {
          continue;
        }
        // sum += w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4, rounded op by op (no FMA), so the
        // emulation in the tests computes the same bits as the GPU.
        const A v1 = static_cast<A>(plane[tap.y_low * width + tap.x_low]);
        const A v2 = static_cast<A>(plane[tap.y_low * width + tap.x_high]);
        const A v3 = static_cast<A>(plane[tap.y_high * width + tap.x_low]);
        const A v4 = static_cast<A>(plane[tap.y_high * width + tap.x_high]);
        const A blend = add_rn(
            add_rn(add_rn(mul_rn(tap.w1, v1), mul_rn(tap.w2, v2)), mul_rn(tap.w3, v3)),
            mul_rn(tap.w4, v4));
        sum = add_rn(sum, blend);
      }
    }
    output[index] = static_cast<T>(sum / g.count);
  }
}

// grad is read through its strides (an expanded grad has zero strides; copying it would
// materialize it). grad_input has the accumulation type A and is contiguous.
template <typename T, typename A>
__global__ void roi_align_backward_kernel(
    int64_t total, const T* __restrict__ grad, int64_t grad_stride_k, int64_t grad_stride_c,
    int64_t grad_stride_h, int64_t grad_stride_w, const T* __restrict__ rois, A spatial_scale,
    int64_t batch_size, int64_t channels, int64_t height, int64_t width, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned, A* __restrict__ grad_input) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const PooledIndex p = unflatten(index, channels, pooled_height, pooled_width);
    if (!roi_usable<A>(rois + p.k * 5, batch_size)) {
      continue;
    }
    const RoiGeometry<A> g = roi_geometry<A>(
        rois + p.k * 5, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
    const A grad_bin = static_cast<A>(
        grad[p.k * grad_stride_k + p.c * grad_stride_c + p.ph * grad_stride_h +
             p.pw * grad_stride_w]);
    A* plane = grad_input + (g.batch * channels + p.c) * height * width;

    for (int iy = 0; iy < g.grid_h; ++iy) {
      const A y = sample_coordinate(g.start_h, g.bin_h, p.ph, iy, g.grid_h);
      for (int ix = 0; ix < g.grid_w; ++ix) {
        const A x = sample_coordinate(g.start_w, g.bin_w, p.pw, ix, g.grid_w);
        const BilinearTap<A> tap = bilinear_tap(height, width, y, x);
        if (!tap.valid) {
          continue;
        }
        // Threads of other rois (and other bins of this one) hit the same pixels: atomics.
        atomicAdd(plane + tap.y_low * width + tap.x_low, grad_bin * tap.w1 / g.count);
        atomicAdd(plane + tap.y_low * width + tap.x_high, grad_bin * tap.w2 / g.count);
        atomicAdd(plane + tap.y_high * width + tap.x_low, grad_bin * tap.w3 / g.count);
        atomicAdd(plane + tap.y_high * width + tap.x_high, grad_bin * tap.w4 / g.count);
      }
    }
  }
}

}  // namespace
}  // namespace detcore
