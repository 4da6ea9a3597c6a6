// ROIAlign forward and backward on the CPU, multi-threaded.
//
// Each roi's bilinear sampling taps (four pixel offsets and weights per sample, the 1/count of
// the bin average folded in) depend only on the roi, not on the channel, so they are computed
// once per roi and reused for every channel.
//  - forward: rois are independent, so threads split the rois;
//  - backward: the gradient of channel c only lands in channel c of the input, so threads split
//    the channels and no two threads ever write the same value: no atomics, no locks.
// Two memory layouts: with many channels and enough rois, the feature map is read channels-last
// so each tap is one contiguous, vectorized pass over the channels (the planar layout makes
// every tap a scalar gather); for few channels or few rois the transposition is not worth it
// and the kernels walk the NCHW planes directly.
#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "../roi_align_common.h"
#include "compute_type.h"
#include "parallel.h"

namespace detcore {
namespace {

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

template <typename T>
void roi_align_forward_impl(
    const at::Tensor& input, const at::Tensor& rois, const RoiAlignParams& p, at::Tensor& output) {
  const int64_t channels = input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* in = input.data_ptr<T>();
  const T* roi_ptr = rois.data_ptr<T>();
  T* out = output.data_ptr<T>();
  at::parallel_for(0, rois.size(0), grain_for(4 * bins * channels), [&](int64_t lo, int64_t hi) {
    RoiTaps<T> rt;
    for (int64_t r = lo; r < hi; ++r) {
      compute_taps(roi_ptr + 5 * r, p, rt);
      const Tap<T>* taps = rt.taps.data();
      for (int64_t c = 0; c < channels; ++c) {
        const T* src = in + (rt.batch * channels + c) * plane;
        T* dst = out + (r * channels + c) * bins;
        for (int64_t b = 0; b < bins; ++b) {
          T sum = 0;
          for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
            const Tap<T>& tap = taps[t];
            sum += tap.w[0] * src[tap.pos[0]] + tap.w[1] * src[tap.pos[1]] +
                   tap.w[2] * src[tap.pos[2]] + tap.w[3] * src[tap.pos[3]];
          }
          dst[b] = sum;
        }
      }
    }
  });
}

// Rois whose taps are held in memory at once during the backward pass; bounds memory while
// keeping the number of parallel regions small.
constexpr int64_t kBackwardRoiChunk = 256;
// At most about this many taps held at once (48 bytes each in float32: ~200 MB): rois with large
// sampling grids go in smaller chunks.
constexpr int64_t kTapBudget = int64_t(1) << 22;

// Calls scatter(first, count, taps) for successive chunks of at most kBackwardRoiChunk rois,
// taps[i] holding the (parallel-computed) taps of roi first + i.
template <typename T, typename Scatter>
void for_each_roi_chunk(const at::Tensor& rois, const RoiAlignParams& p, const Scatter& scatter) {
  const int64_t num_rois = rois.size(0);
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* roi_ptr = rois.data_ptr<T>();
  const int64_t taps_per_roi = std::max<int64_t>(1, bins * p.max_samples_per_bin);
  const int64_t chunk_rois = std::clamp<int64_t>(kTapBudget / taps_per_roi, 1, kBackwardRoiChunk);
  std::vector<RoiTaps<T>> chunk(std::min(num_rois, chunk_rois));
  for (int64_t first = 0; first < num_rois; first += chunk_rois) {
    const int64_t count = std::min(chunk_rois, num_rois - first);
    at::parallel_for(0, count, grain_for(4 * bins), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) compute_taps(roi_ptr + 5 * (first + i), p, chunk[i]);
    });
    scatter(first, count, chunk);
  }
}

template <typename T>
void roi_align_backward_impl(
    const at::Tensor& grad, const at::Tensor& rois, const RoiAlignParams& p,
    at::Tensor& grad_input) {
  const int64_t channels = grad_input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* g = grad.data_ptr<T>();
  T* gin = grad_input.data_ptr<T>();
  for_each_roi_chunk<T>(rois, p, [&](int64_t first, int64_t count, const std::vector<RoiTaps<T>>& chunk) {
    at::parallel_for(0, channels, grain_for(4 * bins * count), [&](int64_t c_lo, int64_t c_hi) {
      for (int64_t c = c_lo; c < c_hi; ++c) {
        for (int64_t i = 0; i < count; ++i) {
          const RoiTaps<T>& rt = chunk[i];
          const Tap<T>* taps = rt.taps.data();
          const T* src = g + ((first + i) * channels + c) * bins;
          T* dst = gin + (rt.batch * channels + c) * plane;
          for (int64_t b = 0; b < bins; ++b) {
            const T gb = src[b];
            for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
              const Tap<T>& tap = taps[t];
              dst[tap.pos[0]] += tap.w[0] * gb;
              dst[tap.pos[1]] += tap.w[1] * gb;
              dst[tap.pos[2]] += tap.w[2] * gb;
              dst[tap.pos[3]] += tap.w[3] * gb;
            }
          }
        }
      }
    });
  });
}

// Whether to run on a channels-last copy: pays off when the taps touch each input value
// several times over, and when there are enough channels to vectorize over.
bool use_channels_last(int64_t num_rois, int64_t channels, int64_t bins, int64_t input_numel) {
  return channels >= 8 && num_rois * bins * channels * 4 >= input_numel;
}

// dst[n][j][i] = src[n][i][j] for [batches, rows, cols] arrays, in cache-sized tiles on all
// threads: the layout changes of the channels-last path, several times faster than a strided copy.
template <typename T>
void batched_transpose(const T* src, T* dst, int64_t batches, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  at::parallel_for(0, batches * row_tiles, grain_for(kTile * cols), [&](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t n = task / row_tiles;
      const int64_t i0 = (task % row_tiles) * kTile;
      const int64_t i1 = std::min(rows, i0 + kTile);
      const T* s = src + n * rows * cols;
      T* d = dst + n * rows * cols;
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const int64_t j1 = std::min(cols, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = j0; j < j1; ++j) d[j * rows + i] = s[i * cols + j];
        }
      }
    }
  });
}

// The input as an [N, H, W, C] buffer (no copy if it already is channels-last).
template <typename T>
at::Tensor to_channels_last(const at::Tensor& input) {
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return input;
  }
  auto src = input.contiguous();
  auto dst = at::empty(
      {input.size(0), input.size(2), input.size(3), input.size(1)}, input.options());
  batched_transpose(
      src.data_ptr<T>(), dst.data_ptr<T>(), input.size(0), input.size(1),
      input.size(2) * input.size(3));
  return dst;
}

template <typename T>
void roi_align_forward_channels_last(
    const at::Tensor& input_cl, const at::Tensor& rois, const RoiAlignParams& p,
    at::Tensor& output) {
  const int64_t channels = output.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* in = input_cl.data_ptr<T>();  // memory order N, H, W, C
  const T* roi_ptr = rois.data_ptr<T>();
  T* out = output.data_ptr<T>();
  at::parallel_for(0, rois.size(0), grain_for(4 * bins * channels), [&](int64_t lo, int64_t hi) {
    RoiTaps<T> rt;
    std::vector<T> acc(bins * channels);  // [bin][channel] for this roi
    for (int64_t r = lo; r < hi; ++r) {
      compute_taps(roi_ptr + 5 * r, p, rt);
      std::fill(acc.begin(), acc.end(), T(0));
      const T* image = in + rt.batch * plane * channels;
      for (int64_t b = 0; b < bins; ++b) {
        T* a = acc.data() + b * channels;
        for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
          const Tap<T>& tap = rt.taps[t];
          const T* p0 = image + tap.pos[0] * channels;
          const T* p1 = image + tap.pos[1] * channels;
          const T* p2 = image + tap.pos[2] * channels;
          const T* p3 = image + tap.pos[3] * channels;
          const T w0 = tap.w[0], w1 = tap.w[1], w2 = tap.w[2], w3 = tap.w[3];
          for (int64_t c = 0; c < channels; ++c) {
            a[c] += w0 * p0[c] + w1 * p1[c] + w2 * p2[c] + w3 * p3[c];
          }
        }
      }
      T* dst = out + r * channels * bins;  // output is [K, C, ph, pw]
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t b = 0; b < bins; ++b) dst[c * bins + b] = acc[b * channels + c];
      }
    }
  });
}

// grad_input_cl is an [N, H, W, C] buffer; threads own disjoint channel ranges.
template <typename T>
void roi_align_backward_channels_last(
    const at::Tensor& grad, const at::Tensor& rois, const RoiAlignParams& p,
    at::Tensor& grad_input_cl) {
  const int64_t num_rois = rois.size(0);
  const int64_t channels = grad_input_cl.size(3);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  // [K, bins, C]: the gradient of one bin is contiguous over channels, like the taps' targets.
  auto grad_t = grad.reshape({num_rois, channels, bins}).transpose(1, 2).contiguous();
  const T* g = grad_t.data_ptr<T>();
  T* gin = grad_input_cl.data_ptr<T>();
  // Channel blocks: a multiple of 16 wide, enough of them to keep every thread busy.
  const int64_t threads = at::get_num_threads();
  const int64_t width = std::max<int64_t>(16, ((channels + threads - 1) / threads + 15) / 16 * 16);
  const int64_t blocks = (channels + width - 1) / width;
  for_each_roi_chunk<T>(rois, p, [&](int64_t first, int64_t count, const std::vector<RoiTaps<T>>& chunk) {
    at::parallel_for(0, blocks, grain_for(4 * bins * count * width), [&](int64_t blo, int64_t bhi) {
      const int64_t c0 = blo * width;
      const int64_t c1 = std::min(channels, bhi * width);
      for (int64_t i = 0; i < count; ++i) {
        const RoiTaps<T>& rt = chunk[i];
        T* image = gin + rt.batch * plane * channels;
        for (int64_t b = 0; b < bins; ++b) {
          const T* gb = g + ((first + i) * bins + b) * channels;
          for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
            const Tap<T>& tap = rt.taps[t];
            for (int k = 0; k < 4; ++k) {
              T* row = image + tap.pos[k] * channels;
              const T w = tap.w[k];
              for (int64_t c = c0; c < c1; ++c) row[c] += w * gb[c];
            }
          }
        }
      }
    });
  });
}

at::Tensor roi_align_forward_cpu(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  const int64_t max_samples = check_roi_align_inputs(
      input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
  if (is_half_type(input)) {
    return roi_align_forward_cpu(
               in_compute_type(input), in_compute_type(rois), spatial_scale, pooled_height,
               pooled_width, sampling_ratio, aligned)
        .to(input.scalar_type());
  }
  auto output = at::zeros(
      {rois.size(0), input.size(1), pooled_height, pooled_width}, input.options());
  if (output.numel() == 0 || input.size(2) == 0 || input.size(3) == 0) {
    return output;
  }
  const RoiAlignParams p{spatial_scale, pooled_height, pooled_width, sampling_ratio,
                         aligned,       input.size(2), input.size(3), max_samples};
  auto rois_c = rois.contiguous();
  // An input that already is channels-last (MODEL.CHANNELS_LAST) is read in place: the planar
  // path would first copy all of it.
  const bool channels_last =
      input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      use_channels_last(rois.size(0), input.size(1), pooled_height * pooled_width, input.numel());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "roi_align_forward_cpu", [&] {
    if (channels_last) {
      roi_align_forward_channels_last<scalar_t>(to_channels_last<scalar_t>(input), rois_c, p, output);
    } else {
      roi_align_forward_impl<scalar_t>(input.contiguous(), rois_c, p, output);
    }
  });
  return output;
}

at::Tensor roi_align_backward_cpu(
    const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t sampling_ratio, bool aligned) {
  const int64_t max_samples = check_roi_align_backward_inputs(
      grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
      width, sampling_ratio, aligned);
  if (is_half_type(grad)) {
    return roi_align_backward_cpu(
               in_compute_type(grad), in_compute_type(rois), spatial_scale, pooled_height,
               pooled_width, batch_size, channels, height, width, sampling_ratio, aligned)
        .to(grad.scalar_type());
  }
  if (grad.numel() == 0 || height == 0 || width == 0) {
    return at::zeros({batch_size, channels, height, width}, grad.options());
  }
  const RoiAlignParams p{spatial_scale, pooled_height, pooled_width, sampling_ratio,
                         aligned,       height,        width,  max_samples};
  auto rois_c = rois.contiguous();
  const int64_t bins = pooled_height * pooled_width;
  if (use_channels_last(rois.size(0), channels, bins, batch_size * channels * height * width)) {
    auto grad_cl = at::zeros({batch_size, height, width, channels}, grad.options());
    auto grad_input = at::empty({batch_size, channels, height, width}, grad.options());
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "roi_align_backward_cpu", [&] {
      roi_align_backward_channels_last<scalar_t>(grad, rois_c, p, grad_cl);
      batched_transpose(
          grad_cl.data_ptr<scalar_t>(), grad_input.data_ptr<scalar_t>(), batch_size,
          height * width, channels);
    });
    return grad_input;
  }
  auto grad_input = at::zeros({batch_size, channels, height, width}, grad.options());
  auto grad_c = grad.contiguous();
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "roi_align_backward_cpu", [&] {
    roi_align_backward_impl<scalar_t>(grad_c, rois_c, p, grad_input);
  });
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_cpu));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_cpu));
}

}  // namespace detcore
