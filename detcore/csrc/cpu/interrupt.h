// Ctrl-C for the CPU kernels: one check shared by every op that can run for seconds.
//
// An op makes one Interrupt on its calling thread and asks stop() between blocks of work (each
// well under a tenth of a second), on whichever thread does the block:
//  - the fast path is two relaxed atomic loads: has a SIGINT arrived since this op last looked?
//  - on the calling thread, when one has, Python decides as it would between two bytecodes: the
//    thread takes the GIL and runs Python's handler (PyErr_CheckSignals). If the handler raises
//    (KeyboardInterrupt by default), stop() tells the op's other threads to stop and throws that
//    exception, which reaches the caller unchanged; if it returns (a program's own handler, one
//    that defers the interrupt), the op goes on;
//  - on another thread (an at::parallel_for worker) stop() never raises: it returns true once the
//    calling thread has decided to stop, and the worker abandons its block.
// How the op sees the signal: interrupt.cpp puts a small C hook in front of SIGINT's handler
// (chaining to it, with its flags and mask) that counts deliveries; it is put there only in
// Python's main thread (the only one Python interrupts), only over a handler function (ignored or
// default SIGINT stays as the process set it), and put back when something replaced it (Python's
// signal.signal installs its own C handler anew). Without Python (TorchScript run from C++), on
// other threads, or when SIGINT is ignored, an Interrupt never stops anything. A SIGINT that came
// while the op was starting (before its first check) is seen by that first check: an op starts
// from the count Python was last asked about (interrupt.cpp). Nothing else outlives an op: the
// next call starts afresh.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace detcore {

namespace interrupt_detail {
extern std::atomic<uint64_t> sigint_count;  // SIGINTs seen by the hook, ever
}  // namespace interrupt_detail

class Interrupt {
 public:
  Interrupt();  // on the op's calling thread
  Interrupt(const Interrupt&) = delete;
  Interrupt& operator=(const Interrupt&) = delete;

  // Between blocks of work, on any thread of the op: see the comment at the top.
  bool stop() {
    if (__builtin_expect(
            interrupt_detail::sigint_count.load(std::memory_order_relaxed) ==
                seen_.load(std::memory_order_relaxed),
            1)) {
      return false;
    }
    return on_signal();
  }

  bool on_calling_thread() const { return std::this_thread::get_id() == caller_; }

 private:
  bool on_signal();

  const std::thread::id caller_;
  const bool armed_;                // Python can be asked on this thread
  std::atomic<uint64_t> seen_;      // SIGINTs already handled by this op
  std::atomic<bool> stopped_{false};
};

// Items of a parallel region finished, for the calling thread to wait on while it keeps checking
// for interrupts: its work done, it would otherwise sit in the region's closing barrier, deaf,
// while a worker finishes a long block.
class Tally {
 public:
  explicit Tally(int64_t total) : total_(total) {}

  void add(int64_t items) {
    if (done_.fetch_add(items, std::memory_order_acq_rel) + items >= total_) {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_.notify_all();
    }
  }

  // Calling thread only: returns when every item is done, or throws from interrupt.stop().
  // Spins (yielding) for a while first, as the barrier it replaces would: most regions end soon.
  void wait(Interrupt& interrupt) {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    while (!finished()) {
      interrupt.stop();
      if (std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait_for(lock, std::chrono::milliseconds(10), [&] { return finished(); });
    }
  }

 private:
  bool finished() const { return done_.load(std::memory_order_acquire) >= total_; }

  const int64_t total_;
  std::atomic<int64_t> done_{0};
  std::mutex mutex_;
  std::condition_variable finished_;
};

// Counts a block's items into a Tally when it leaves scope, thrown out of or not.
class TallyItems {
 public:
  TallyItems(Tally& tally, int64_t items) : tally_(tally), items_(items) {}
  ~TallyItems() { tally_.add(items_); }
  TallyItems(const TallyItems&) = delete;
  TallyItems& operator=(const TallyItems&) = delete;

 private:
  Tally& tally_;
  const int64_t items_;
};

}  // namespace detcore
