// The schemas of detcore's operators. Kernels register themselves per backend in cpu/, cuda/,
// autograd/; this file only says what the ops are, so torch.ops.detcore.* exists as soon as
// detcore._C is loaded.
#include <string>

#include <torch/library.h>

#include "build_info.h"
#include "cpu/isa_dispatch.h"

namespace detcore {

TORCH_LIBRARY(detcore, m) {
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  m.def("batched_nms(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
  m.def(
      "roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height, "
      "int pooled_width, int sampling_ratio, bool aligned) -> Tensor");
  // The input's shape is symbolic (SymInt) so that tracing roi_align with dynamic image sizes
  // (torch.export, torch.compile) does not fix them to the example's.
  m.def(
      "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
      "int pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
      "int sampling_ratio, bool aligned) -> Tensor");
  // ROIPool returns the pooled values and, for its backward, where each came from (an offset
  // into the input's H * W plane, -1 for an empty bin), as torchvision's op does.
  m.def(
      "roi_pool(Tensor input, Tensor rois, float spatial_scale, int pooled_height, "
      "int pooled_width) -> (Tensor, Tensor)");
  m.def(
      "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
      "int pooled_height, int pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
      "SymInt width) -> Tensor");  // symbolic input shape: see _roi_align_backward

  // Deformable convolution (v1; v2 "modulated" with a mask), torchvision's semantics. groups and
  // offset_groups are explicit (the Python wrapper infers them from the shapes, as torchvision).
  m.def(
      "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor? mask, Tensor? bias, "
      "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, "
      "int groups, int offset_groups) -> Tensor");
  // -> (grad_input, grad_weight, grad_offset, grad_mask, grad_bias); grad_mask is empty ([0])
  // without a mask, grad_bias is [out_channels] with or without a bias.
  m.def(
      "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
      "Tensor? mask, Tensor? bias, int stride_h, int stride_w, int pad_h, int pad_w, "
      "int dilation_h, int dilation_w, int groups, int offset_groups) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // RetinaNet's sigmoid focal loss (torchvision's sigmoid_focal_loss): reduction 'none', 'mean'
  // or 'sum'; alpha < 0 means no alpha weighting.
  m.def(
      "sigmoid_focal_loss(Tensor inputs, Tensor targets, float alpha, float gamma, str reduction) "
      "-> Tensor");
  // -> (grad_inputs, grad_targets); grad_targets is empty ([0]) unless targets_grad.
  m.def(
      "_sigmoid_focal_loss_backward(Tensor grad, Tensor inputs, Tensor targets, float alpha, "
      "float gamma, str reduction, bool targets_grad) -> (Tensor, Tensor)");
  // What this binary was built with, for collect_env and for clear errors.
  m.def("_cuda_version() -> int", &cuda_version);
  m.def("_cuda_arch_list() -> str", &cuda_arch_list);
  m.def("_cuda_ptx_arch() -> int", &cuda_ptx_arch);
  // The SIMD instruction set the vectorized CPU kernels run with here (cpu/isa_dispatch.h).
  m.def("_cpu_capability() -> str", [] { return std::string(cpu_isa_name(cpu_isa())); });
}

}  // namespace detcore
