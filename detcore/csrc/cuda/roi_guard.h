// What the CUDA ROIAlign / ROIPool kernels do with a roi that the argument checks (checks.h:
// check_rois) would refuse, for callers that turned those checks off (value_checks.h): a batch
// index outside [0, batch_size) (NaN included) or an infinite / NaN coordinate pools nothing
// (zeros, no gradient) instead of reading or writing another image's memory or sampling an
// unbounded grid. A roi the checks admit always passes, so the checked results are unchanged.
#pragma once

#include <cstdint>

#include "../rounded_ops.h"  // DETCORE_HOST_DEVICE

namespace detcore {

// T is the rois' type, A the type they are compared in (float for half / bfloat16).
template <typename A, typename T>
DETCORE_HOST_DEVICE bool roi_usable(const T* roi, int64_t batch_size) {
  const A batch = static_cast<A>(roi[0]);
  bool usable = batch >= A(0) && batch < static_cast<A>(batch_size);
  for (int i = 1; i < 5; ++i) {
    const A v = static_cast<A>(roi[i]);
    usable = usable && v - v == A(0);  // false for +-inf and NaN
  }
  return usable;
}

}  // namespace detcore
