// The switch of the argument checks that read tensor values (a roi's batch index and finiteness,
// roi_pool's argmax offsets, the focal loss's targets, batched_nms's floating ids). On a GPU each
// brings a summary to the host: a sync per call, which stalls the CPU's queueing of work and rules
// out CUDA-graph capture. The model's own calls pass tensors it made itself and turn them off
// (detcore.layers.trusted_inputs()); a direct call keeps them. Per thread, on by default.
//
// Only the CUDA launchers consult it: on the CPU a check costs no sync, and some CPU kernels size
// their work from it. Shape, dtype and device checks always run (they read no values). With the
// checks off, the CUDA kernels stay memory-safe whatever the values (cuda/roi_guard.h), and give
// unspecified results for inputs the checks would have refused.
//
// Autograd runs a CUDA backward on another thread: each autograd Function records the switch at
// forward and restores it around its backward (ValueChecksGuard).
#pragma once

namespace detcore {

bool value_checks_enabled();

// Sets the calling thread's switch; returns its previous state.
bool set_value_checks_enabled(bool enabled);

// Sets the switch for a scope and restores the previous state after it.
class ValueChecksGuard {
 public:
  explicit ValueChecksGuard(bool enabled) : previous_(set_value_checks_enabled(enabled)) {}
  ~ValueChecksGuard() { set_value_checks_enabled(previous_); }
  ValueChecksGuard(const ValueChecksGuard&) = delete;
  ValueChecksGuard& operator=(const ValueChecksGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace detcore
