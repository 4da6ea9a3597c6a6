// What the CPU and CUDA NMS share on the host: the IoU threshold in the type the IoU is computed
// in (float for float, half and bfloat16 boxes; double for double).
#pragma once

#include <cmath>
#include <limits>

namespace detcore {

// The largest T not above `threshold`: for any T value v, v > result <=> (double)v > threshold,
// so comparing in T gives torchvision's result, which compares in double. (The next T above the
// result is above the threshold, so v > result means v > threshold.)
template <typename T>
T threshold_in(double threshold) {
  T t = static_cast<T>(threshold);
  if (static_cast<double>(t) > threshold) {
    t = std::nextafter(t, -std::numeric_limits<T>::infinity());
  }
  return t;
}

}  // namespace detcore
