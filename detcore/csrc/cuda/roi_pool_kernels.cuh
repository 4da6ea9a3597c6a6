// Device code of roi_pool and its backward, one thread per pooled element (forward) or incoming
// gradient (backward), in grid-stride loops. No runtime, no ATen: the host compiler builds it
// too, under the CUDA emulation of the tests (tests/layers/cuda_emulation/).
//
// The bins come from roi_pool_common.h, shared with the CPU kernel, so both devices pool the
// same pixels, compare them in the same order (row-major, strict >: the first of equal maxima
// wins) and record the same argmax. T is the tensors' type, A the type the geometry and the
// comparisons use (float for half / bfloat16, on exactly upcast values); the backward adds into
// a zeroed buffer of type A with atomics.
#pragma once

#include <cstdint>

#include "../roi_pool_common.h"
#include "roi_guard.h"

namespace detcore {
namespace {  // included by roi_pool_kernel.cu alone (and by the emulation's own translation unit)

template <typename T, typename A>
__global__ void roi_pool_forward_kernel(
    int64_t total, const T* __restrict__ input, const T* __restrict__ rois, A spatial_scale,
    int64_t batch_size, int64_t channels, int64_t height, int64_t width, int64_t pooled_height,
    int64_t pooled_width, T* __restrict__ output, int32_t* __restrict__ argmax) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    // index = ((k * channels + c) * pooled_height + ph) * pooled_width + pw
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / pooled_width / pooled_height) % channels;
    const int64_t k = index / pooled_width / pooled_height / channels;
    if (!roi_usable<A>(rois + k * 5, batch_size)) {
      output[index] = T(0);
      argmax[index] = -1;
      continue;
    }
    const RoiPoolGeometry<A> g =
        roi_pool_geometry<A>(rois + k * 5, spatial_scale, pooled_height, pooled_width);
    const PixelRange rows = roi_pool_bin_range(g.start_h, g.bin_h, ph, height);
    const PixelRange cols = roi_pool_bin_range(g.start_w, g.bin_w, pw, width);
    const T* plane = input + (g.batch * channels + c) * height * width;

    const bool empty = rows.end <= rows.begin || cols.end <= cols.begin;
    A best = empty ? A(0) : static_cast<A>(kRoiPoolLowest);
    int32_t best_at = -1;
    for (int64_t h = rows.begin; h < rows.end; ++h) {
      for (int64_t w = cols.begin; w < cols.end; ++w) {
        const A v = static_cast<A>(plane[h * width + w]);
        if (v > best) {
          best = v;
          best_at = static_cast<int32_t>(h * width + w);
        }
      }
    }
    output[index] = static_cast<T>(best);
    argmax[index] = best_at;
  }
}

// grad is read through its strides (an expanded grad has zero strides); argmax is contiguous,
// [K, C, ph, pw] like the forward's output; grad_input has type A and is contiguous.
template <typename T, typename A>
__global__ void roi_pool_backward_kernel(
    int64_t total, const T* __restrict__ grad, int64_t grad_stride_k, int64_t grad_stride_c,
    int64_t grad_stride_h, int64_t grad_stride_w, const int32_t* __restrict__ argmax,
    const T* __restrict__ rois, int64_t batch_size, int64_t channels, int64_t height,
    int64_t width, int64_t pooled_height, int64_t pooled_width, A* __restrict__ grad_input) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const int32_t offset = argmax[index];
    // An empty bin (or one of only NaN / -FLT_MAX values) passes nothing back; an offset past the
    // plane comes only from unchecked inputs (value_checks.h).
    if (offset < 0 || offset >= height * width) {
      continue;
    }
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / pooled_width / pooled_height) % channels;
    const int64_t k = index / pooled_width / pooled_height / channels;
    if (!roi_usable<A>(rois + k * 5, batch_size)) {
      continue;
    }
    const int64_t batch = float_to_int<int64_t>(static_cast<A>(rois[k * 5]));
    const A value = static_cast<A>(
        grad[k * grad_stride_k + c * grad_stride_c + ph * grad_stride_h + pw * grad_stride_w]);
    // Overlapping rois (and bins sharing a border pixel) send gradients to the same pixel.
    atomicAdd(grad_input + (batch * channels + c) * height * width + offset, value);
  }
}

}  // namespace
}  // namespace detcore
