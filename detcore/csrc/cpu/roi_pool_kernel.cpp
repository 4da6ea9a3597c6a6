// ROIPool forward and backward on the CPU, multi-threaded.
//
// A bin's rows depend only on its row index and its columns only on its column index (see
// roi_pool_common.h), so each roi's bins are two short tables, computed once for all channels.
// The work is bound by memory: rois overlap, and torchvision's roi-major loop reads each roi's
// region of every channel from memory. Here the loops keep a part of the map in the cache while
// many rois read it:
//  - forward, a few rois: threads take (channel, roi) pairs channel by channel, pooling every
//    roi from one NCHW plane while it is in the cache;
//  - forward, rois that cover the map several times (any layout): threads take blocks of 16
//    channels, copy the block's slice of the map into a buffer that stays in the cache, and pool
//    every roi from it, 16 channels at a time in vector registers;
//  - backward: each gradient goes to the pixel its forward argmax names, in the same channel,
//    so threads split the channels and never write the same value: no atomics. Within a
//    channel the gradients are added roi by roi, bin by bin: torchvision's order, so the sums
//    are the same bits.
// The max is taken with a strict >, pixels in row-major order, as torchvision does: the first
// of equal maxima wins (and gets the gradient), NaN is never picked.
// float16 / bfloat16 are computed in float32 (exact for a max) and cast back.
// Every path asks for Ctrl-C between rois (interrupt.h).
#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "../roi_pool_common.h"
#include "channel_blocks.h"
#include "parallel.h"

namespace detcore {
namespace {

struct RoiPoolParams {
  double spatial_scale;
  int64_t pooled_height, pooled_width;
  int64_t height, width;
};

// Every roi's image and its bins' pixel ranges along each axis, computed once (in parallel) and
// shared by all channels.
struct AllBins {
  int64_t pooled_height, pooled_width;
  std::vector<int64_t> batch;     // [K]
  std::vector<PixelRange> rows;   // [K, pooled_height]
  std::vector<PixelRange> cols;   // [K, pooled_width]

  const PixelRange* rows_of(int64_t r) const { return rows.data() + r * pooled_height; }
  const PixelRange* cols_of(int64_t r) const { return cols.data() + r * pooled_width; }
};

template <typename T>
AllBins compute_all_bins(const at::Tensor& rois, const RoiPoolParams& p) {
  const int64_t num_rois = rois.size(0);
  AllBins out{p.pooled_height, p.pooled_width, std::vector<int64_t>(num_rois),
              std::vector<PixelRange>(num_rois * p.pooled_height),
              std::vector<PixelRange>(num_rois * p.pooled_width)};
  const T* roi_ptr = rois.data_ptr<T>();
  const T scale = static_cast<T>(p.spatial_scale);
  at::parallel_for(0, num_rois, grain_for(64 * (p.pooled_height + p.pooled_width)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const auto g = roi_pool_geometry<T, T>(roi_ptr + 5 * r, scale, p.pooled_height, p.pooled_width);
      out.batch[r] = g.batch;
      for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
        out.rows[r * p.pooled_height + ph] = roi_pool_bin_range(g.start_h, g.bin_h, ph, p.height);
      }
      for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
        out.cols[r * p.pooled_width + pw] = roi_pool_bin_range(g.start_w, g.bin_w, pw, p.width);
      }
    }
  });
  return out;
}

inline bool is_empty(PixelRange rows, PixelRange cols) {
  return rows.end <= rows.begin || cols.end <= cols.begin;
}

// NCHW input. Work items are (channel, roi) pairs, channel-major, so that a thread pools many rois
// from one H * W plane while it sits in its cache: the map is read from memory about once, where
// torchvision's roi-major order reads every roi's region of every channel from memory.
template <typename T>
void roi_pool_forward_planar(
    const at::Tensor& input, const AllBins& bins_of, const RoiPoolParams& p, at::Tensor& output,
    at::Tensor& argmax, Interrupt& interrupt) {
  const int64_t num_rois = output.size(0);
  const int64_t channels = input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* in = input.data_ptr<T>();
  T* out = output.data_ptr<T>();
  int32_t* arg = argmax.data_ptr<int32_t>();
  // Work per pair: about the roi's area; 4 per bin is a fair stand-in for the grain.
  parallel_chunks(interrupt, channels * num_rois, 64, 4 * bins, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      if (item % 8 == 0 && interrupt.stop()) return;  // a roi may span the whole map
      const int64_t c = item / num_rois;
      const int64_t r = item % num_rois;
      const T* src = in + (bins_of.batch[r] * channels + c) * plane;
      T* dst = out + (r * channels + c) * bins;
      int32_t* dst_arg = arg + (r * channels + c) * bins;
      const PixelRange* rows_of = bins_of.rows_of(r);
      const PixelRange* cols_of = bins_of.cols_of(r);
      for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
        const PixelRange rows = rows_of[ph];
        for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
          const PixelRange cols = cols_of[pw];
          const int64_t b = ph * p.pooled_width + pw;
          if (is_empty(rows, cols)) {
            dst[b] = T(0);
            dst_arg[b] = -1;
            continue;
          }
          T best = static_cast<T>(kRoiPoolLowest);
          int32_t best_at = -1;
          for (int64_t h = rows.begin; h < rows.end; ++h) {
            const T* line = src + h * p.width;
            for (int64_t w = cols.begin; w < cols.end; ++w) {
              if (line[w] > best) {
                best = line[w];
                best_at = static_cast<int32_t>(h * p.width + w);
              }
            }
          }
          dst[b] = best;
          dst_arg[b] = best_at;
        }
      }
    }
  });
}

// Max and argmax of one non-empty bin over channels [0, n) of a block, scalar.
template <typename T>
void pool_bin_block_scalar(
    const T* image, int64_t width, int64_t channels, int64_t n, PixelRange rows, PixelRange cols,
    T* best, int32_t* best_at) {
  for (int64_t k = 0; k < n; ++k) {
    best[k] = static_cast<T>(kRoiPoolLowest);
    best_at[k] = -1;
  }
  for (int64_t h = rows.begin; h < rows.end; ++h) {
    for (int64_t w = cols.begin; w < cols.end; ++w) {
      const int32_t offset = static_cast<int32_t>(h * width + w);
      const T* v = image + (h * width + w) * channels;
      for (int64_t k = 0; k < n; ++k) {
        if (v[k] > best[k]) {
          best[k] = v[k];
          best_at[k] = offset;
        }
      }
    }
  }
}

#if defined(__GNUC__)
// 16-byte vectors of the compiler (GCC and Clang, any target; SSE2 on x86-64): the compiler does
// not vectorize the compare-and-select of a running max and its argmax by itself. The max is
// selected bitwise with the comparison's mask (all ones where v > max: false for NaN), and the
// mask, narrowed to int32 lanes, selects the argmax.
template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  static constexpr int kCount = 4;
  typedef float Value __attribute__((vector_size(16)));
  typedef int32_t Bits __attribute__((vector_size(16)));
};
template <>
struct Lanes<double> {
  static constexpr int kCount = 2;
  typedef double Value __attribute__((vector_size(16)));
  typedef int64_t Bits __attribute__((vector_size(16)));
};

// A full block of kBlock channels: kBlock / lanes independent vector chains per pixel.
template <typename T>
void pool_bin_block(
    const T* image, int64_t width, int64_t channels, int64_t n, PixelRange rows, PixelRange cols,
    T* best, int32_t* best_at) {
  using L = Lanes<T>;
  typedef typename L::Value Value;
  typedef typename L::Bits Bits;
  typedef int32_t Index __attribute__((vector_size(4 * L::kCount)));
  constexpr int kVectors = kBlock / L::kCount;
  if (n < kBlock) {
    pool_bin_block_scalar(image, width, channels, n, rows, cols, best, best_at);
    return;
  }
  Value m[kVectors];
  Index a[kVectors];
  for (int k = 0; k < kVectors; ++k) {
    m[k] = Value{} + static_cast<T>(kRoiPoolLowest);
    a[k] = Index{} - 1;
  }
  for (int64_t h = rows.begin; h < rows.end; ++h) {
    for (int64_t w = cols.begin; w < cols.end; ++w) {
      const T* v = image + (h * width + w) * channels;
      const Index offset = Index{} + static_cast<int32_t>(h * width + w);
      for (int k = 0; k < kVectors; ++k) {
        Value x;
        std::memcpy(&x, v + k * L::kCount, sizeof(x));
        const Bits greater = x > m[k];
        m[k] = reinterpret_cast<Value>((reinterpret_cast<Bits>(x) & greater) |
                                       (reinterpret_cast<Bits>(m[k]) & ~greater));
        const Index take = __builtin_convertvector(greater, Index);
        a[k] = (offset & take) | (a[k] & ~take);
      }
    }
  }
  std::memcpy(best, m, sizeof(m));
  std::memcpy(best_at, a, sizeof(a));
}
#else
template <typename T>
void pool_bin_block(
    const T* image, int64_t width, int64_t channels, int64_t n, PixelRange rows, PixelRange cols,
    T* best, int32_t* best_at) {
  pool_bin_block_scalar(image, width, channels, n, rows, cols, best, best_at);
}
#endif

// Threads take blocks of kBlock channels; each copies its block of the map into its own
// [N, H * W, kBlock] buffer (a few MB: it stays in the cache while every roi reads it) and pools
// every roi from it, a pixel's channels compared with their running max and argmax in vector
// registers. One parallel region with no barrier inside: on a busy machine every barrier waits
// for the thread the OS delayed most.
template <typename T>
void roi_pool_forward_blocked(
    const at::Tensor& input, const AllBins& bins_of, const RoiPoolParams& p, at::Tensor& output,
    at::Tensor& argmax, Interrupt& interrupt) {
  const int64_t num_rois = output.size(0);
  const int64_t channels = output.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const bool channels_last = input.is_contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor source = channels_last ? input : input.contiguous();
  const int64_t block_size = input.size(0) * plane * kBlock;
  std::vector<std::vector<T>> buffers(at::get_num_threads());  // one per thread, made on first use
  T* out = output.data_ptr<T>();
  int32_t* arg = argmax.data_ptr<int32_t>();
  // Rois in the order of their place on the map (image, then top row, then left column): a roi
  // then mostly reads rows of the buffer that its predecessor just brought into the cache.
  std::vector<int64_t> order(num_rois);
  for (int64_t r = 0; r < num_rois; ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
    const PixelRange ri = bins_of.rows_of(i)[0], rj = bins_of.rows_of(j)[0];
    const PixelRange ci = bins_of.cols_of(i)[0], cj = bins_of.cols_of(j)[0];
    return std::tie(bins_of.batch[i], ri.begin, ci.begin) <
           std::tie(bins_of.batch[j], rj.begin, cj.begin);
  });
  const int64_t blocks = (channels + kBlock - 1) / kBlock;
  parallel_chunks(interrupt, blocks, 1, 4 * bins * kBlock * num_rois, [&](int64_t lo, int64_t hi) {
    std::vector<T>& buffer = buffers[at::get_thread_num()];
    buffer.resize(block_size);
    T* block = buffer.data();
    std::vector<T> best(bins * kBlock);  // [bin][channel of the block] for one roi
    std::vector<int32_t> best_at(bins * kBlock);
    for (int64_t c0 = lo * kBlock; c0 < std::min(channels, hi * kBlock); c0 += kBlock) {
      const int64_t n = std::min(kBlock, channels - c0);
      gather_block(source, channels_last, c0, n, block);
      for (const int64_t r : order) {
        if (interrupt.stop()) return;
        const T* image = block + bins_of.batch[r] * plane * kBlock;
        const PixelRange* rows_of = bins_of.rows_of(r);
        const PixelRange* cols_of = bins_of.cols_of(r);
        for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
          for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
            const int64_t b = ph * p.pooled_width + pw;
            T* m = best.data() + b * kBlock;
            int32_t* a = best_at.data() + b * kBlock;
            if (is_empty(rows_of[ph], cols_of[pw])) {
              std::fill(m, m + n, T(0));
              std::fill(a, a + n, int32_t(-1));
            } else {
              pool_bin_block(image, p.width, kBlock, n, rows_of[ph], cols_of[pw], m, a);
            }
          }
        }
        // output and argmax are [K, C, ph, pw]
        for (int64_t k = 0; k < n; ++k) {
          T* dst = out + (r * channels + c0 + k) * bins;
          int32_t* dst_arg = arg + (r * channels + c0 + k) * bins;
          for (int64_t b = 0; b < bins; ++b) {
            dst[b] = best[b * kBlock + k];
            dst_arg[b] = best_at[b * kBlock + k];
          }
        }
      }
    }
  });
}

// Whether the rois read the map enough times over to pay for copying it block by block (the
// planar path reads only the rois' regions, with no copy: better for a few rois).
bool use_blocks(int64_t num_rois, int64_t channels, int64_t bins, int64_t images, int64_t plane) {
  return channels >= kBlock / 2 && num_rois * bins * 4 >= images * plane;
}

std::tuple<at::Tensor, at::Tensor> roi_pool_forward_float(
    const at::Tensor& input, const at::Tensor& rois, const RoiPoolParams& p) {
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  auto output = at::empty({num_rois, channels, p.pooled_height, p.pooled_width}, input.options());
  auto argmax = at::empty(output.sizes(), input.options().dtype(at::kInt));
  if (output.numel() == 0) {
    return {output, argmax};
  }
  if (p.height == 0 || p.width == 0) {  // every bin is empty
    return {output.zero_(), argmax.fill_(-1)};
  }
  auto rois_c = rois.contiguous();
  const int64_t bins = p.pooled_height * p.pooled_width;
  const bool blocks = use_blocks(num_rois, channels, bins, input.size(0), p.height * p.width);
  Interrupt interrupt;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "roi_pool_forward_cpu", [&] {
    const AllBins bins_of = compute_all_bins<scalar_t>(rois_c, p);
    if (blocks) {
      roi_pool_forward_blocked<scalar_t>(input, bins_of, p, output, argmax, interrupt);
    } else {
      roi_pool_forward_planar<scalar_t>(input.contiguous(), bins_of, p, output, argmax, interrupt);
    }
  });
  return {output, argmax};
}

std::tuple<at::Tensor, at::Tensor> roi_pool_forward_cpu(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width) {
  check_roi_pool_inputs(input, rois, spatial_scale, pooled_height, pooled_width);
  const RoiPoolParams p{spatial_scale, pooled_height, pooled_width, input.size(2), input.size(3)};
  if (input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble) {
    return roi_pool_forward_float(input, rois, p);
  }
  // float16 / bfloat16: the max of exactly upcast values, cast back exactly.
  auto [output, argmax] = roi_pool_forward_float(input.to(at::kFloat), rois.to(at::kFloat), p);
  return {output.to(input.scalar_type()), argmax};
}

template <typename T>
void roi_pool_backward_impl(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    const RoiPoolParams& p, at::Tensor& grad_input, Interrupt& interrupt) {
  const int64_t num_rois = rois.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  std::vector<int64_t> batch(num_rois);
  const T* roi_ptr = rois.data_ptr<T>();
  for (int64_t r = 0; r < num_rois; ++r) batch[r] = static_cast<int64_t>(roi_ptr[5 * r]);
  // grad is read through its strides: the grad of out.sum() is expanded (zero strides).
  const T* g = grad.data_ptr<T>();
  const int64_t s0 = grad.stride(0), s1 = grad.stride(1), s2 = grad.stride(2), s3 = grad.stride(3);
  const int32_t* arg = argmax.data_ptr<int32_t>();
  T* gin = grad_input.data_ptr<T>();  // uninitialized: each channel's planes are zeroed here
  const int64_t images = grad_input.size(0);
  parallel_chunks(interrupt, channels, 4, num_rois * bins + images * plane, [&](int64_t c_lo, int64_t c_hi) {
    for (int64_t c = c_lo; c < c_hi; ++c) {
      // Zeroed just before the adds, so they find the planes in the cache (a separate zero fill
      // of the whole gradient would write it to memory and read it back).
      for (int64_t n = 0; n < images; ++n) {
        std::fill(gin + (n * channels + c) * plane, gin + (n * channels + c + 1) * plane, T(0));
      }
      for (int64_t r = 0; r < num_rois; ++r) {
        if (r % 64 == 0 && interrupt.stop()) return;  // a roi's bins: few adds each
        const int32_t* a = arg + (r * channels + c) * bins;
        const T* src = g + r * s0 + c * s1;
        T* dst = gin + (batch[r] * channels + c) * plane;
        for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
          for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
            const int32_t offset = a[ph * p.pooled_width + pw];
            if (offset >= 0) dst[offset] += src[ph * s2 + pw * s3];
          }
        }
      }
    }
  });
}

at::Tensor roi_pool_backward_cpu(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
    double spatial_scale, int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
    int64_t channels, int64_t height, int64_t width) {
  check_roi_pool_backward_inputs(
      grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels,
      height, width);
  const RoiPoolParams p{spatial_scale, pooled_height, pooled_width, height, width};
  const bool low_precision = grad.scalar_type() == at::kHalf || grad.scalar_type() == at::kBFloat16;
  const at::Tensor g = low_precision ? grad.to(at::kFloat) : grad;
  const at::Tensor r = low_precision ? rois.to(at::kFloat).contiguous() : rois.contiguous();
  auto grad_input = at::empty({batch_size, channels, height, width}, g.options());
  if (g.numel() == 0 || height == 0 || width == 0) {
    grad_input.zero_();
  } else {
    const at::Tensor argmax_c = argmax.contiguous();
    Interrupt interrupt;
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "roi_pool_backward_cpu", [&] {
      roi_pool_backward_impl<scalar_t>(g, r, argmax_c, p, grad_input, interrupt);
    });
  }
  return low_precision ? grad_input.to(grad.scalar_type()) : grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("roi_pool", TORCH_FN(roi_pool_forward_cpu));
  m.impl("_roi_pool_backward", TORCH_FN(roi_pool_backward_cpu));
}

}  // namespace detcore
