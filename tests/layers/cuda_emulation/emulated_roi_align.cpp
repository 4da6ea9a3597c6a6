// torch.ops.detcore_emulated.roi_align* : detcore's CUDA ROIAlign kernels (roi_align_kernels.cuh)
// run by the CUDA emulation on CPU tensors, launched like roi_align_kernel.cu launches them
// (launch_config.h). The grid limit is an argument, defaulting to the real one.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <string>

#include "cuda_emulation.h"
#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/roi_align_kernels.cuh"

namespace {

using detcore::kRoiAlignThreads;
using detcore::roi_align_blocks;

at::Tensor roi_align(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned, int64_t max_blocks) {
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const auto shape = {rois.size(0), channels, pooled_height, pooled_width};
  if (height == 0 || width == 0) {
    return at::zeros(shape, input.options());
  }
  // NaN where the kernel writes nothing, like the uninitialized memory of at::empty on the GPU.
  at::Tensor output = at::full(shape, NAN, input.options());
  const int64_t total = output.numel();
  if (total == 0) {
    return output;
  }
  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_align", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cuda_emulation::launch(
        dim3(roi_align_blocks(total, max_blocks)), dim3(kRoiAlignThreads), 0,
        detcore::roi_align_forward_kernel<scalar_t, acc_t>, total,
        static_cast<const scalar_t*>(input_c.data_ptr<scalar_t>()),
        static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()),
        static_cast<acc_t>(spatial_scale), input.size(0), channels, height, width, pooled_height,
        pooled_width, sampling_ratio, aligned, output.data_ptr<scalar_t>());
  });
  return output;
}

at::Tensor roi_align_backward(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned, int64_t max_blocks) {
  at::Tensor grad_input = at::zeros(
      {batch_size, channels, height, width},
      grad.options().dtype(at::toOpMathType(grad.scalar_type())));
  const int64_t total = grad.numel();
  if (total == 0 || height == 0 || width == 0) {
    return grad_input.to(grad.scalar_type());
  }
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_align_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        cuda_emulation::launch(
            dim3(roi_align_blocks(total, max_blocks)), dim3(kRoiAlignThreads), 0,
            detcore::roi_align_backward_kernel<scalar_t, acc_t>, total,
            static_cast<const scalar_t*>(grad.data_ptr<scalar_t>()), grad.stride(0),
            grad.stride(1), grad.stride(2), grad.stride(3),
            static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()),
            static_cast<acc_t>(spatial_scale), batch_size, channels, height, width,
            pooled_height, pooled_width, sampling_ratio, aligned, grad_input.data_ptr<acc_t>());
      });
  return grad_input.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limit = "int max_blocks=" + std::to_string(detcore::kMaxBlocks);
  m.def(
      ("roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height, "
       "int pooled_width, int sampling_ratio, bool aligned, " + limit + ") -> Tensor").c_str(),
      &roi_align);
  m.def(
      ("roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
       "int pooled_width, int batch_size, int channels, int height, int width, "
       "int sampling_ratio, bool aligned, " + limit + ") -> Tensor").c_str(),
      &roi_align_backward);
}
