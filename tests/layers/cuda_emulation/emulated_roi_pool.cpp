// torch.ops.detcore_emulated.roi_pool* : detcore's CUDA ROIPool kernels (roi_pool_kernels.cuh)
// run by the CUDA emulation on CPU tensors, launched like roi_pool_kernel.cu launches them
// (launch_config.h). The grid limit is an argument, defaulting to the real one.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "cuda_emulation.h"
#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/roi_pool_kernels.cuh"

namespace {

using detcore::kRoiPoolThreads;
using detcore::roi_pool_blocks;

std::tuple<at::Tensor, at::Tensor> roi_pool(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t max_blocks) {
  const auto shape = {rois.size(0), input.size(1), pooled_height, pooled_width};
  // NaN and a value no kernel writes where the kernel writes nothing, like the uninitialized
  // memory of at::empty on the GPU.
  at::Tensor output = at::full(shape, NAN, input.options());
  at::Tensor argmax = at::full(shape, -7, input.options().dtype(at::kInt));
  const int64_t total = output.numel();
  if (total == 0) {
    return {output, argmax};
  }
  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_pool", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    cuda_emulation::launch(
        dim3(roi_pool_blocks(total, max_blocks)), dim3(kRoiPoolThreads), 0,
        detcore::roi_pool_forward_kernel<scalar_t, acc_t>, total,
        static_cast<const scalar_t*>(input_c.data_ptr<scalar_t>()),
        static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()),
        static_cast<acc_t>(spatial_scale), input.size(0), input.size(1), input.size(2),
        input.size(3), pooled_height, pooled_width, output.data_ptr<scalar_t>(), argmax.data_ptr<int32_t>());
  });
  return {output, argmax};
}

at::Tensor roi_pool_backward(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    int64_t batch_size, int64_t channels, int64_t height, int64_t width, int64_t max_blocks) {
  at::Tensor grad_input = at::zeros(
      {batch_size, channels, height, width},
      grad.options().dtype(at::toOpMathType(grad.scalar_type())));
  const int64_t total = grad.numel();
  if (total == 0 || height == 0 || width == 0) {
    return grad_input.to(grad.scalar_type());
  }
  const at::Tensor rois_c = rois.contiguous();
  const at::Tensor argmax_c = argmax.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_pool_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        cuda_emulation::launch(
            dim3(roi_pool_blocks(total, max_blocks)), dim3(kRoiPoolThreads), 0,
            detcore::roi_pool_backward_kernel<scalar_t, acc_t>, total,
            static_cast<const scalar_t*>(grad.data_ptr<scalar_t>()), grad.stride(0),
            grad.stride(1), grad.stride(2), grad.stride(3),
            static_cast<const int32_t*>(argmax_c.data_ptr<int32_t>()),
            static_cast<const scalar_t*>(rois_c.data_ptr<scalar_t>()), batch_size, channels,
            height, width, grad.size(2), grad.size(3), grad_input.data_ptr<acc_t>());
      });
  return grad_input.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  const std::string limit = "int max_blocks=" + std::to_string(detcore::kMaxBlocks);
  m.def(
      ("roi_pool(Tensor input, Tensor rois, float spatial_scale, int pooled_height, "
       "int pooled_width, " + limit + ") -> (Tensor, Tensor)").c_str(),
      &roi_pool);
  m.def(
      ("roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, int batch_size, int channels, "
       "int height, int width, " + limit + ") -> Tensor").c_str(),
      &roi_pool_backward);
}
