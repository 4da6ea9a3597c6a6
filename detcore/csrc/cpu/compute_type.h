// The CPU kernels compute in float32 or float64. float16 and bfloat16 tensors (which torchvision's
// CPU ops accept) are computed in float32, upcast exactly, and the results rounded back once, as
// the CUDA kernels do through their accumulation type.
#pragma once

#include <ATen/ATen.h>

namespace detcore {

inline bool is_half_type(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// t in the type the CPU kernels compute in (its memory format kept).
inline at::Tensor in_compute_type(const at::Tensor& t) {
  return is_half_type(t) ? t.to(at::kFloat) : t;
}

}  // namespace detcore
