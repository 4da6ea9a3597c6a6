// How finely the CPU kernels split work across threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <ATen/Parallel.h>

#include "interrupt.h"

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

// Items handed out at a time by parallel_chunks: about a twentieth of kMinChunkWork each (tens of
// microseconds), so that a thread delayed by the OS holds back little work, and the shared
// counter is touched rarely.
inline int64_t chunk_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinChunkWork / 20 / std::max<int64_t>(1, work_per_item));
}

// at::parallel_for splits a range into one fixed share per thread, so on a busy machine the
// region lasts as long as its most delayed thread. Here threads take chunks of `chunk` items
// as they come free instead. Small work (under grain_for's threshold) runs on this thread, in
// pieces of that size.
// Every thread asks `interrupt` before each chunk or piece; a body whose items can take long asks
// it inside too, and returns when it says stop. The calling thread, once no chunk is left, waits
// for the others' last chunks still asking it, rather than deaf in the region's barrier.
template <typename Body>
void parallel_chunks(
    Interrupt& interrupt, int64_t n, int64_t chunk, int64_t work_per_item, const Body& body) {
  if (n <= 0) {
    return;
  }
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + chunk - 1) / chunk);
  if (threads <= 1 || n <= grain_for(work_per_item)) {
    const int64_t piece = std::max(chunk, grain_for(work_per_item));
    for (int64_t lo = 0; lo < n; lo += piece) {
      if (interrupt.stop()) return;
      body(lo, std::min(n, lo + piece));
    }
    return;
  }
  std::atomic<int64_t> next{0};
  Tally tally(n);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t lo = next.fetch_add(chunk); lo < n; lo = next.fetch_add(chunk)) {
      const int64_t hi = std::min(n, lo + chunk);
      TallyItems done(tally, hi - lo);
      if (interrupt.stop()) return;
      body(lo, hi);
    }
    if (interrupt.on_calling_thread()) tally.wait(interrupt);
  });
}

}  // namespace detcore
