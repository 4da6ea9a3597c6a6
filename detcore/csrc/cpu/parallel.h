// How finely the CPU kernels split work across threads.
#pragma once

#include <algorithm>
#include <cstdint>

namespace detcore {

// Least work (simple multiply-adds) worth a thread of its own, about half a millisecond: below
// it, waking threads costs more than it saves, and far more on a busy machine.
constexpr int64_t kMinChunkWork = 1 << 19;

// Grain for at::parallel_for over items of `work_per_item` each: chunks get at least
// kMinChunkWork, so a small total runs on the calling thread alone.
inline int64_t grain_for(int64_t work_per_item) {
  const int64_t per_item = std::max<int64_t>(1, work_per_item);
  return std::max<int64_t>(1, (kMinChunkWork + per_item - 1) / per_item);
}

}  // namespace detcore
