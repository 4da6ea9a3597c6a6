// Floating point to integer conversion with the GPU's semantics, on every device: truncated
// toward zero, saturated to the integer type's range, NaN gives 0 (PTX cvt.rzi, what a
// static_cast compiles to in device code). On the host a static_cast of NaN or of a value out of
// range is undefined (x86 gives the lowest value), so a CPU kernel and the CUDA emulation could
// disagree with the GPU, or agree with each other by accident. Device code, and the headers it
// shares with the CPU kernels, converts through float_to_int: the same definition on both sides,
// so both agree by construction. The CUDA emulation is built with -fsanitize=float-cast-overflow
// (tests/layers/cuda_emulation/), which stops at any raw conversion left that overflows.
#pragma once

#include <limits>
#include <type_traits>

#include "rounded_ops.h"  // DETCORE_HOST_DEVICE

namespace detcore {

template <typename I, typename F>
DETCORE_HOST_DEVICE I float_to_int(F v) {
  static_assert(std::is_integral<I>::value, "float_to_int converts to an integer type");
  static_assert(std::is_floating_point<F>::value, "convert half types to float first");
  constexpr I lowest = std::numeric_limits<I>::min();
  constexpr I highest = std::numeric_limits<I>::max();
  if (v != v) {
    return I(0);
  }
  // lowest is -2^k, exact in F. highest is exact in F or rounds up to 2^k: either way every v
  // below F(highest) truncates into range, and every v at or above it saturates.
  if (v <= static_cast<F>(lowest)) {
    return lowest;
  }
  if (v >= static_cast<F>(highest)) {
    return highest;
  }
  return static_cast<I>(v);
}

}  // namespace detcore
