// CUDA kernels of roi_align and its backward, one thread per output (pooled) element.
//
// The sampling geometry comes from roi_align_common.h, shared with the CPU kernel, so both
// devices sample the same points with the same weights. Sums are taken in the accumulation
// type (float for half / bfloat16); the backward scatters into a zeroed buffer of that type
// with atomics and casts once at the end, so half gradients lose nothing to half-precision adds.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "../checks.h"
#include "../roi_align_common.h"

namespace detcore {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride loops cover the rest

int64_t grid_size(int64_t total) {
  return std::min((total + kThreads - 1) / kThreads, kMaxBlocks);
}

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

template <typename T>
__global__ void roi_align_forward_kernel(
    int64_t total, const T* __restrict__ input, const T* __restrict__ rois,
    at::opmath_type<T> spatial_scale, int64_t channels, int64_t height, int64_t width,
    int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned,
    T* __restrict__ output) {
  using A = at::opmath_type<T>;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const PooledIndex p = unflatten(index, channels, pooled_height, pooled_width);
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
        sum += tap.w1 * static_cast<A>(plane[tap.y_low * width + tap.x_low]) +
               tap.w2 * static_cast<A>(plane[tap.y_low * width + tap.x_high]) +
               tap.w3 * static_cast<A>(plane[tap.y_high * width + tap.x_low]) +
               tap.w4 * static_cast<A>(plane[tap.y_high * width + tap.x_high]);
      }
    }
    output[index] = static_cast<T>(sum / g.count);
  }
}

// grad is read through its strides (an expanded grad has zero strides; copying it would
// materialize it). grad_input has the accumulation type A and is contiguous.
template <typename T>
__global__ void roi_align_backward_kernel(
    int64_t total, const T* __restrict__ grad, int64_t grad_stride_k, int64_t grad_stride_c,
    int64_t grad_stride_h, int64_t grad_stride_w, const T* __restrict__ rois,
    at::opmath_type<T> spatial_scale, int64_t channels, int64_t height, int64_t width,
    int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned,
    at::opmath_type<T>* __restrict__ grad_input) {
  using A = at::opmath_type<T>;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += stride) {
    const PooledIndex p = unflatten(index, channels, pooled_height, pooled_width);
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
        atomicAdd(plane + tap.y_low * width + tap.x_low, grad_bin * tap.w1 / g.count);
        atomicAdd(plane + tap.y_low * width + tap.x_high, grad_bin * tap.w2 / g.count);
        atomicAdd(plane + tap.y_high * width + tap.x_low, grad_bin * tap.w3 / g.count);
        atomicAdd(plane + tap.y_high * width + tap.x_high, grad_bin * tap.w4 / g.count);
      }
    }
  }
}

at::Tensor roi_align_forward_cuda(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  check_roi_align_inputs(input, rois, pooled_height, pooled_width, sampling_ratio);
  at::cuda::CUDAGuard device_guard(input.device());

  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  // A map with no pixels has nothing to sample: every bin averages to 0.
  if (height == 0 || width == 0) {
    return at::zeros({num_rois, channels, pooled_height, pooled_width}, input.options());
  }
  at::Tensor output =
      at::empty({num_rois, channels, pooled_height, pooled_width}, input.options());
  const int64_t total = output.numel();
  if (total == 0) {
    return output;
  }

  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_roi_align_forward_cuda", [&] {
        roi_align_forward_kernel<scalar_t><<<grid_size(total), kThreads, 0, stream>>>(
            total, input_c.data_ptr<scalar_t>(), rois_c.data_ptr<scalar_t>(),
            static_cast<at::opmath_type<scalar_t>>(spatial_scale), channels, height, width,
            pooled_height, pooled_width, sampling_ratio, aligned, output.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return output;
}

at::Tensor roi_align_backward_cuda(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned) {
  check_roi_align_backward_inputs(
      grad, rois, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio);
  at::cuda::CUDAGuard device_guard(grad.device());

  const at::ScalarType acc_type = at::toOpMathType(grad.scalar_type());
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_type));
  const int64_t total = grad.numel();
  if (total == 0 || height == 0 || width == 0) {
    return grad_input.to(grad.scalar_type());
  }

  const at::Tensor rois_c = rois.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "detcore_roi_align_backward_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        roi_align_backward_kernel<scalar_t><<<grid_size(total), kThreads, 0, stream>>>(
            total, grad.data_ptr<scalar_t>(), grad.stride(0), grad.stride(1), grad.stride(2),
            grad.stride(3), rois_c.data_ptr<scalar_t>(), static_cast<acc_t>(spatial_scale),
            channels, height, width, pooled_height, pooled_width, sampling_ratio, aligned,
            grad_input.data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  // A no-op for float / double (same dtype); one cast for half / bfloat16.
  return grad_input.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CUDA, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_cuda));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_cuda));
}

}  // namespace detcore
