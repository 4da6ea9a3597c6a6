// The bilinear taps of ROIAlign on the CPU (roi_align_kernel.cpp): for one roi, each sample's
// four pixel offsets and weights (the 1/count of the bin average folded in). They depend only on
// the roi, not on the channel, so they are computed once per roi and reused for every channel.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "../roi_align_common.h"

namespace detcore {

// One bilinear sample: four offsets into an H*W plane and their weights (already / count).
template <typename T>
struct Tap {
  int64_t pos[4];
  T w[4];
};

struct RoiAlignParams {
  double spatial_scale;
  int64_t pooled_height, pooled_width, sampling_ratio;
  bool aligned;
  int64_t height, width;
  int64_t max_samples_per_bin;  // over all rois (from the argument checks)
};

// Taps of one roi, bin by bin: bin_start[b]..bin_start[b+1] index into `taps`.
template <typename T>
struct RoiTaps {
  int64_t batch = 0;
  std::vector<Tap<T>> taps;
  std::vector<int64_t> bin_start;
};

template <typename T>
void compute_taps(const T* roi, const RoiAlignParams& p, RoiTaps<T>& out) {
  const auto g = roi_geometry<T, T>(
      roi, static_cast<T>(p.spatial_scale), p.pooled_height, p.pooled_width, p.sampling_ratio,
      p.aligned);
  out.batch = g.batch;
  out.taps.clear();
  out.bin_start.assign(1, 0);
  const T inv_count = T(1) / g.count;
  for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
    for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
      for (int iy = 0; iy < g.grid_h; ++iy) {
        const T y = sample_coordinate(g.start_h, g.bin_h, ph, iy, g.grid_h);
        for (int ix = 0; ix < g.grid_w; ++ix) {
          const T x = sample_coordinate(g.start_w, g.bin_w, pw, ix, g.grid_w);
          const auto t = bilinear_tap<T>(p.height, p.width, y, x);
          if (!t.valid) continue;  // contributes zero; skip rather than store zero weights
          Tap<T> tap;
          tap.pos[0] = t.y_low * p.width + t.x_low;
          tap.pos[1] = t.y_low * p.width + t.x_high;
          tap.pos[2] = t.y_high * p.width + t.x_low;
          tap.pos[3] = t.y_high * p.width + t.x_high;
          tap.w[0] = t.w1 * inv_count;
          tap.w[1] = t.w2 * inv_count;
          tap.w[2] = t.w3 * inv_count;
          tap.w[3] = t.w4 * inv_count;
          out.taps.push_back(tap);
        }
      }
      out.bin_start.push_back(static_cast<int64_t>(out.taps.size()));
    }
  }
}

// At most about this many taps are kept for a call (48 bytes each in float32: ~200 MB); past it
// every use recomputes its roi's taps.
constexpr int64_t kTapBudget = int64_t(1) << 22;

// The taps of every roi of a call, shared by the threads and computed on first use, without
// waiting: the first thread to need a roi claims it and computes its taps into the table; a
// thread that needs a roi whose taps another thread is still computing computes its own copy
// (on a busy machine that other thread may be descheduled for a whole time slice).
template <typename T>
class SharedTaps {
 public:
  SharedTaps(const T* rois, int64_t num_rois, const RoiAlignParams& p)
      : rois_(rois), params_(p),
        cached_(num_rois * p.pooled_height * p.pooled_width *
                    std::max<int64_t>(1, p.max_samples_per_bin) <= kTapBudget),
        table_(cached_ ? num_rois : 0), state_(new std::atomic<uint8_t>[cached_ ? num_rois : 0]) {
    for (int64_t r = 0; r < static_cast<int64_t>(table_.size()); ++r) state_[r].store(kEmpty);
  }

  // The taps of roi r; `scratch` (the calling thread's own) holds them when the table cannot.
  const RoiTaps<T>& of(int64_t r, RoiTaps<T>& scratch) {
    if (cached_) {
      uint8_t state = state_[r].load(std::memory_order_acquire);
      if (state == kReady) return table_[r];
      if (state == kEmpty && state_[r].compare_exchange_strong(state, kComputing)) {
        compute_taps(rois_ + 5 * r, params_, table_[r]);
        state_[r].store(kReady, std::memory_order_release);
        return table_[r];
      }
    }
    compute_taps(rois_ + 5 * r, params_, scratch);
    return scratch;
  }

 private:
  static constexpr uint8_t kEmpty = 0, kComputing = 1, kReady = 2;

  const T* rois_;
  RoiAlignParams params_;
  bool cached_;
  std::vector<RoiTaps<T>> table_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
};

}  // namespace detcore
