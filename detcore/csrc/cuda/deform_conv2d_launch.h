// Host side of the CUDA deform_conv2d: buffers, one image at a time, the kernels of
// deform_conv2d_kernels.cuh and the GEMMs between them (at::mm, on the tensors' device), and the
// dtype dispatch. Shared by the real launcher (deform_conv2d_kernel.cu) and the CUDA emulation of
// the tests (on CPU tensors), which pass their launch policy (launch_config.h), so both run
// exactly this sequence. Everything is computed in the accumulation type A (float for half /
// bfloat16); the results are returned in the input's type.
#pragma once

#include <tuple>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include "deform_conv2d_kernels.cuh"
#include "launch_config.h"

namespace detcore {

struct DeformConvArguments {
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups;
};

inline DeformGeometry deform_geometry(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const DeformConvArguments& a) {
  DeformGeometry g;
  g.channels = input.size(1);
  g.height = input.size(2);
  g.width = input.size(3);
  g.kernel_h = weight.size(2);
  g.kernel_w = weight.size(3);
  g.stride_h = a.stride_h;
  g.stride_w = a.stride_w;
  g.pad_h = a.pad_h;
  g.pad_w = a.pad_w;
  g.dilation_h = a.dilation_h;
  g.dilation_w = a.dilation_w;
  g.out_w = offset.size(3);
  g.positions = offset.size(2) * offset.size(3);
  g.offset_groups = a.offset_groups;
  return g;
}

// kernel on deform_conv2d_blocks(total) blocks of kDeformConvThreads threads; nothing when total
// is 0 (CUDA refuses an empty grid).
template <typename Launch, typename Kernel, typename... Args>
void deform_launch(const Launch& launch, int64_t total, Kernel kernel, Args... args) {
  if (total == 0) return;
  launch(
      dim3(deform_conv2d_blocks(total, launch.limits.max_blocks)), dim3(kDeformConvThreads), 0,
      kernel, args...);
}

template <typename T, typename Launch>
at::Tensor deform_columns(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const DeformConvArguments& a, const Launch& launch) {
  using A = at::opmath_type<T>;
  const DeformGeometry g = deform_geometry(input, weight, offset, a);
  const int64_t taps = g.kernel_h * g.kernel_w;
  const at::Tensor input_c = input.contiguous();
  const at::Tensor offset_c = offset.contiguous();
  const at::Tensor mask_c = mask.has_value() && mask->defined() ? mask->contiguous() : at::Tensor();
  at::Tensor columns = launch.empty(
      {input.size(0), g.channels * taps, g.positions}, input.options().dtype(c10::CppTypeToScalarType<A>::value));
  for (int64_t n = 0; n < input.size(0); ++n) {
    deform_launch(
        launch, g.channels * g.positions, deform_im2col_kernel<T, A>, g.channels * g.positions,
        static_cast<const T*>(input_c[n].data_ptr<T>()),
        static_cast<const T*>(offset_c[n].data_ptr<T>()),
        static_cast<const T*>(mask_c.defined() ? mask_c[n].data_ptr<T>() : nullptr), g,
        columns[n].data_ptr<A>());
  }
  return columns;
}

template <typename T, typename Launch>
at::Tensor deform_forward(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    const DeformConvArguments& a, const Launch& launch) {
  using A = at::opmath_type<T>;
  const auto acc = input.options().dtype(c10::CppTypeToScalarType<A>::value);
  const DeformGeometry g = deform_geometry(input, weight, offset, a);
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t batch = input.size(0);
  const int64_t out_channels = weight.size(0);
  const int64_t group_rows = weight.size(1) * taps;  // (C / G) * K
  const at::Tensor input_c = input.contiguous();
  const at::Tensor offset_c = offset.contiguous();
  const at::Tensor mask_c = mask.has_value() && mask->defined() ? mask->contiguous() : at::Tensor();
  const at::Tensor w = weight.to(acc).reshape({a.groups, out_channels / a.groups, group_rows});
  at::Tensor out = at::zeros({batch, out_channels, g.positions}, acc);
  at::Tensor columns = launch.empty({g.channels * taps, g.positions}, acc);
  for (int64_t n = 0; n < batch; ++n) {
    deform_launch(
        launch, g.channels * g.positions, deform_im2col_kernel<T, A>, g.channels * g.positions,
        static_cast<const T*>(input_c[n].data_ptr<T>()),
        static_cast<const T*>(offset_c[n].data_ptr<T>()),
        static_cast<const T*>(mask_c.defined() ? mask_c[n].data_ptr<T>() : nullptr), g,
        columns.data_ptr<A>());
    at::Tensor out_n = out[n].view({a.groups, out_channels / a.groups, g.positions});
    for (int64_t grp = 0; grp < a.groups; ++grp) {
      at::Tensor out_g = out_n[grp];
      at::mm_out(out_g, w[grp], columns.narrow(0, grp * group_rows, group_rows));
    }
  }
  if (bias.has_value() && bias->defined()) {
    out.add_(bias->to(acc).view({1, out_channels, 1}));
  }
  return out.view({batch, out_channels, offset.size(2), offset.size(3)}).to(input.scalar_type());
}

template <typename T, typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const DeformConvArguments& a, const Launch& launch) {
  using A = at::opmath_type<T>;
  const auto acc = input.options().dtype(c10::CppTypeToScalarType<A>::value);
  const DeformGeometry g = deform_geometry(input, weight, offset, a);
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t batch = input.size(0);
  const int64_t out_channels = weight.size(0);
  const int64_t out_per_group = out_channels / a.groups;
  const int64_t group_rows = weight.size(1) * taps;
  const bool has_mask = mask.has_value() && mask->defined();
  const at::Tensor input_c = input.contiguous();
  const at::Tensor offset_c = offset.contiguous();
  const at::Tensor mask_c = has_mask ? mask->contiguous() : at::Tensor();
  const at::Tensor grad_a = grad.to(acc).contiguous().view({batch, a.groups, out_per_group, g.positions});
  const at::Tensor w = weight.to(acc).reshape({a.groups, out_per_group, group_rows});
  at::Tensor grad_input = at::zeros(input.sizes(), acc);
  at::Tensor grad_offset = at::zeros(offset.sizes(), acc);
  at::Tensor grad_mask = has_mask ? at::zeros(mask->sizes(), acc) : at::zeros({0}, acc);
  at::Tensor grad_w = at::zeros({a.groups, out_per_group, group_rows}, acc);
  at::Tensor columns = launch.empty({g.channels * taps, g.positions}, acc);
  at::Tensor grad_columns = launch.empty({g.channels * taps, g.positions}, acc);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t grp = 0; grp < a.groups; ++grp) {
      at::Tensor gc = grad_columns.narrow(0, grp * group_rows, group_rows);
      at::mm_out(gc, w[grp].t(), grad_a[n][grp]);
    }
    const T* offset_n = offset_c[n].data_ptr<T>();
    const T* mask_n = has_mask ? mask_c[n].data_ptr<T>() : nullptr;
    const T* input_n = input_c[n].data_ptr<T>();
    const int64_t entries = g.channels * taps * g.positions;
    deform_launch(
        launch, entries, deform_col2im_kernel<T, A>, entries,
        static_cast<const A*>(grad_columns.data_ptr<A>()), offset_n, mask_n, g,
        grad_input[n].data_ptr<A>());
    const int64_t points = a.offset_groups * taps * g.positions;
    deform_launch(
        launch, points, deform_coordinate_grad_kernel<T, A>, points,
        static_cast<const A*>(grad_columns.data_ptr<A>()), input_n, offset_n, mask_n, g,
        grad_offset[n].data_ptr<A>(), has_mask ? grad_mask[n].data_ptr<A>() : nullptr);
    deform_launch(
        launch, g.channels * g.positions, deform_im2col_kernel<T, A>, g.channels * g.positions,
        input_n, offset_n, mask_n, g, columns.data_ptr<A>());
    for (int64_t grp = 0; grp < a.groups; ++grp) {
      grad_w[grp].addmm_(grad_a[n][grp], columns.narrow(0, grp * group_rows, group_rows).t());
    }
  }
  const auto dtype = input.scalar_type();
  return {grad_input.to(dtype), grad_w.view(weight.sizes()).to(dtype), grad_offset.to(dtype),
          grad_mask.to(dtype), grad_a.sum(at::IntArrayRef{0, 3}).reshape({out_channels}).to(dtype)};
}

// The columns [N, C * K, P] of every image (type A): the forward's im2col, for tests.
template <typename Launch>
at::Tensor deform_conv2d_columns(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const DeformConvArguments& a, const Launch& launch) {
  at::Tensor columns;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_deform_conv2d_columns_cuda", [&] {
        columns = deform_columns<scalar_t>(input, weight, offset, mask, a, launch);
      });
  return columns;
}

template <typename Launch>
at::Tensor deform_conv2d_forward_launch(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    const DeformConvArguments& a, const Launch& launch) {
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_deform_conv2d_forward_cuda", [&] {
        out = deform_forward<scalar_t>(input, weight, offset, mask, bias, a, launch);
      });
  return out;
}

// -> (grad_input, grad_weight, grad_offset, grad_mask ([0] without a mask), grad_bias)
template <typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
deform_conv2d_backward_launch(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const DeformConvArguments& a, const Launch& launch) {
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> grads;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "detcore_deform_conv2d_backward_cuda", [&] {
        grads = deform_backward<scalar_t>(grad, input, weight, offset, mask, a, launch);
      });
  return grads;
}

}  // namespace detcore
