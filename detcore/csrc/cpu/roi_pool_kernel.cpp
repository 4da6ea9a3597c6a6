// ROIPool forward and backward on the CPU, multi-threaded.
//
// A bin's rows depend only on its row index and its columns only on its column index (see
// roi_pool_common.h), so each roi's bins are two short tables computed once per roi, for every
// channel.
//  - forward: with many channels and enough rois the map is read channels-last, where one pixel
//    is a contiguous run of channels: the running max and argmax of a bin are updated for all
//    channels at once in a loop the compiler vectorizes (compare and select), instead of one
//    scalar compare per pixel and channel. For few channels or few rois the transposition does
//    not pay and threads split (roi, channel) pairs over the NCHW planes.
//  - backward: each gradient goes to the pixel its forward argmax names, in the same channel,
//    so threads split the channels and never write the same value: no atomics. Within a
//    channel the gradients are added roi by roi, bin by bin: torchvision's order, so the sums
//    are the same bits.
// The max is taken with a strict >, pixels in row-major order, as torchvision does: the first
// of equal maxima wins (and gets the gradient), NaN is never picked.
// float16 / bfloat16 are computed in float32 (exact for a max) and cast back.
#include <algorithm>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "../roi_pool_common.h"
#include "layout.h"
#include "parallel.h"

namespace detcore {
namespace {

struct RoiPoolParams {
  double spatial_scale;
  int64_t pooled_height, pooled_width;
  int64_t height, width;
};

// One roi's image and its bins' pixel ranges along each axis.
struct RoiBins {
  int64_t batch = 0;
  std::vector<PixelRange> rows, cols;  // [pooled_height], [pooled_width]
};

template <typename T>
void compute_bins(const T* roi, const RoiPoolParams& p, RoiBins& out) {
  const auto g = roi_pool_geometry<T, T>(
      roi, static_cast<T>(p.spatial_scale), p.pooled_height, p.pooled_width);
  out.batch = g.batch;
  out.rows.resize(p.pooled_height);
  out.cols.resize(p.pooled_width);
  for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
    out.rows[ph] = roi_pool_bin_range(g.start_h, g.bin_h, ph, p.height);
  }
  for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
    out.cols[pw] = roi_pool_bin_range(g.start_w, g.bin_w, pw, p.width);
  }
}

template <typename T>
void roi_pool_forward_planar(
    const at::Tensor& input, const at::Tensor& rois, const RoiPoolParams& p, at::Tensor& output,
    at::Tensor& argmax) {
  const int64_t channels = input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* in = input.data_ptr<T>();
  const T* roi_ptr = rois.data_ptr<T>();
  T* out = output.data_ptr<T>();
  int32_t* arg = argmax.data_ptr<int32_t>();
  const int64_t items = rois.size(0) * channels;  // (roi, channel) pairs
  // Work per pair: about the roi's area; the bins are a fair stand-in.
  at::parallel_for(0, items, grain_for(4 * bins), [&](int64_t lo, int64_t hi) {
    RoiBins rb;
    int64_t current = -1;
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t r = item / channels;
      const int64_t c = item % channels;
      if (r != current) {
        compute_bins(roi_ptr + 5 * r, p, rb);
        current = r;
      }
      const T* src = in + (rb.batch * channels + c) * plane;
      T* dst = out + item * bins;
      int32_t* dst_arg = arg + item * bins;
      for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
        const PixelRange rows = rb.rows[ph];
        for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
          const PixelRange cols = rb.cols[pw];
          const int64_t b = ph * p.pooled_width + pw;
          if (rows.end <= rows.begin || cols.end <= cols.begin) {
            dst[b] = T(0);
            dst_arg[b] = -1;
            continue;
          }
          T best = static_cast<T>(kRoiPoolLowest);
          int32_t best_at = -1;
          for (int64_t h = rows.begin; h < rows.end; ++h) {
            for (int64_t w = cols.begin; w < cols.end; ++w) {
              const T v = src[h * p.width + w];
              if (v > best) {
                best = v;
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

// The max and argmax of one non-empty bin for every channel, from a channels-last image.
template <typename T>
void pool_bin_channels_last(
    const T* image, int64_t width, int64_t channels, PixelRange rows, PixelRange cols, T* best,
    int32_t* best_at) {
  std::fill(best, best + channels, static_cast<T>(kRoiPoolLowest));
  std::fill(best_at, best_at + channels, int32_t(-1));
  for (int64_t h = rows.begin; h < rows.end; ++h) {
    for (int64_t w = cols.begin; w < cols.end; ++w) {
      const int32_t offset = static_cast<int32_t>(h * width + w);
      const T* v = image + (h * width + w) * channels;
      // Branch-free so that it vectorizes: compare, then select both the value and the index.
      for (int64_t c = 0; c < channels; ++c) {
        const bool greater = v[c] > best[c];
        best[c] = greater ? v[c] : best[c];
        best_at[c] = greater ? offset : best_at[c];
      }
    }
  }
}

template <typename T>
void roi_pool_forward_channels_last(
    const at::Tensor& input_cl, const at::Tensor& rois, const RoiPoolParams& p,
    at::Tensor& output, at::Tensor& argmax) {
  const int64_t channels = output.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* in = input_cl.data_ptr<T>();  // memory order N, H, W, C
  const T* roi_ptr = rois.data_ptr<T>();
  T* out = output.data_ptr<T>();
  int32_t* arg = argmax.data_ptr<int32_t>();
  at::parallel_for(0, rois.size(0), grain_for(4 * bins * channels), [&](int64_t lo, int64_t hi) {
    RoiBins rb;
    std::vector<T> best(bins * channels);  // [bin][channel] for this roi
    std::vector<int32_t> best_at(bins * channels);
    for (int64_t r = lo; r < hi; ++r) {
      compute_bins(roi_ptr + 5 * r, p, rb);
      const T* image = in + rb.batch * plane * channels;
      for (int64_t ph = 0; ph < p.pooled_height; ++ph) {
        for (int64_t pw = 0; pw < p.pooled_width; ++pw) {
          const int64_t b = ph * p.pooled_width + pw;
          T* m = best.data() + b * channels;
          int32_t* a = best_at.data() + b * channels;
          const PixelRange rows = rb.rows[ph];
          const PixelRange cols = rb.cols[pw];
          if (rows.end <= rows.begin || cols.end <= cols.begin) {
            std::fill(m, m + channels, T(0));
            std::fill(a, a + channels, int32_t(-1));
          } else {
            pool_bin_channels_last(image, p.width, channels, rows, cols, m, a);
          }
        }
      }
      T* dst = out + r * channels * bins;  // output and argmax are [K, C, ph, pw]
      int32_t* dst_arg = arg + r * channels * bins;
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t b = 0; b < bins; ++b) {
          dst[c * bins + b] = best[b * channels + c];
          dst_arg[c * bins + b] = best_at[b * channels + c];
        }
      }
    }
  });
}

// Whether to pool from a channels-last copy: pays when the bins read the map's values several
// times over (overlapping rois), and when there are enough channels to vectorize over.
bool use_channels_last(int64_t num_rois, int64_t channels, int64_t bins, int64_t input_numel) {
  return channels >= 8 && num_rois * bins * channels * 4 >= input_numel;
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
  // An input that already is channels-last is read in place: the planar path would copy it all.
  const bool channels_last = input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
                             use_channels_last(num_rois, channels, bins, input.numel());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "roi_pool_forward_cpu", [&] {
    if (channels_last) {
      roi_pool_forward_channels_last<scalar_t>(
          nhwc_buffer<scalar_t>(input), rois_c, p, output, argmax);
    } else {
      roi_pool_forward_planar<scalar_t>(input.contiguous(), rois_c, p, output, argmax);
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
    const RoiPoolParams& p, at::Tensor& grad_input) {
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
  T* gin = grad_input.data_ptr<T>();
  at::parallel_for(0, channels, grain_for(num_rois * bins), [&](int64_t c_lo, int64_t c_hi) {
    for (int64_t c = c_lo; c < c_hi; ++c) {
      for (int64_t r = 0; r < num_rois; ++r) {
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
  auto grad_input = at::zeros({batch_size, channels, height, width}, g.options());
  if (g.numel() > 0 && height > 0 && width > 0) {
    const at::Tensor argmax_c = argmax.contiguous();
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "roi_pool_backward_cpu", [&] {
      roi_pool_backward_impl<scalar_t>(g, r, argmax_c, p, grad_input);
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
