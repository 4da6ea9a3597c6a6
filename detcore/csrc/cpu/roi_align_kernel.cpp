// ROIAlign forward and backward on the CPU, multi-threaded, one parallel region per call.
//
// Each roi's bilinear taps are computed once and reused for every channel (roi_align_taps.h).
// Threads take pieces of work as they come free (parallel_chunks), and nothing in a call waits
// for another thread except the end of its single parallel region: on a busy machine, each
// barrier costs a time slice of the most delayed thread.
//  - forward, many rois on an NCHW map: threads take blocks of 16 channels, copy the block's
//    slice of the map into a buffer that stays in the cache (channel_blocks.h) and pool every roi
//    from it, 16 channels at a time in vector registers;
//  - forward, a channels-last map (MODEL.CHANNELS_LAST): threads take rois, each tap one
//    vectorized pass over the channels, read in place;
//  - forward, few rois or few channels: threads take rois and walk the NCHW planes;
//  - backward, many rois: threads take blocks of 16 channels, add every roi's gradient into a
//    zeroed [N, H*W, 16] buffer and copy it into the NCHW gradient; few rois or channels: threads
//    take channels and add into the NCHW planes (zeroed just before). The gradient of channel c
//    only lands in channel c, so no two threads write the same value: no atomics, no locks.
// The sums are the same bits in every path and for any number of threads: each output value is
// summed tap by tap in the same order, and each gradient value roi by roi (in index order), bin
// by bin, tap by tap. Every path asks for Ctrl-C before each roi (interrupt.h): a roi with
// sampling_ratio 128 has 16384 taps a bin.
#include <algorithm>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "channel_blocks.h"
#include "compute_type.h"
#include "parallel.h"
#include "roi_align_taps.h"

namespace detcore {
namespace {

// Multiply-adds of one roi over one channel (the work unit of the grains).
int64_t roi_work(const RoiAlignParams& p) {
  return 4 * p.pooled_height * p.pooled_width * std::max<int64_t>(1, p.max_samples_per_bin);
}

// ------------------------------------------------------------------------------------ forward

// One roi over all channels of an NCHW map: output[r] (planar).
template <typename T>
void pool_roi_planar(
    const T* in, int64_t channels, const RoiTaps<T>& rt, const RoiAlignParams& p, T* out_roi) {
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const Tap<T>* taps = rt.taps.data();
  for (int64_t c = 0; c < channels; ++c) {
    const T* src = in + (rt.batch * channels + c) * plane;
    T* dst = out_roi + c * bins;
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

// One roi over all channels of an [N, H, W, C] map: acc is [bins][C], then output[r] [C][bins].
template <typename T>
void pool_roi_channels_last(
    const T* in, int64_t channels, const RoiTaps<T>& rt, const RoiAlignParams& p, T* acc,
    T* out_roi) {
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  std::fill(acc, acc + bins * channels, T(0));
  const T* image = in + rt.batch * plane * channels;
  for (int64_t b = 0; b < bins; ++b) {
    T* a = acc + b * channels;
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
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t b = 0; b < bins; ++b) out_roi[c * bins + b] = acc[b * channels + c];
  }
}

// Threads take rois; each roi's taps are computed by the thread that pools it.
template <typename T>
void roi_align_forward_by_roi(
    const at::Tensor& input, bool channels_last, const at::Tensor& rois, const RoiAlignParams& p,
    at::Tensor& output, Interrupt& interrupt) {
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* in = input.data_ptr<T>();
  const T* roi_ptr = rois.data_ptr<T>();
  T* out = output.data_ptr<T>();
  const int64_t work = roi_work(p) * channels;
  parallel_chunks(interrupt, num_rois, chunk_for(work), work, [&](int64_t lo, int64_t hi) {
    RoiTaps<T> rt;
    std::vector<T> acc(channels_last ? bins * channels : 0);
    for (int64_t r = lo; r < hi; ++r) {
      if (interrupt.stop()) return;
      compute_taps(roi_ptr + 5 * r, p, rt);
      if (channels_last) {
        pool_roi_channels_last(in, channels, rt, p, acc.data(), out + r * channels * bins);
      } else {
        pool_roi_planar(in, channels, rt, p, out + r * channels * bins);
      }
    }
  });
}

// Threads take blocks of kBlock channels of an NCHW map: each copies its block into its own
// [N, H*W, kBlock] buffer and pools every roi from it, rois in the order of their place on the
// map (consecutive rois then read rows of the buffer that are already in the cache).
template <typename T>
void roi_align_forward_blocked(
    const at::Tensor& input, const at::Tensor& rois, const RoiAlignParams& p, at::Tensor& output,
    Interrupt& interrupt) {
  const int64_t num_rois = rois.size(0);
  const int64_t images = input.size(0), channels = input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  const T* roi_ptr = rois.data_ptr<T>();
  T* out = output.data_ptr<T>();
  std::vector<int64_t> order(num_rois);
  for (int64_t r = 0; r < num_rois; ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
    const T* a = roi_ptr + 5 * i;
    const T* b = roi_ptr + 5 * j;
    return std::tie(a[0], a[2], a[1]) < std::tie(b[0], b[2], b[1]);  // image, top, left
  });
  SharedTaps<T> taps(roi_ptr, num_rois, p);
  struct Scratch {
    std::vector<T> block, acc;
    RoiTaps<T> taps;
  };
  std::vector<Scratch> scratch(at::get_num_threads());
  const int64_t blocks = (channels + kBlock - 1) / kBlock;
  const int64_t work = (roi_work(p) * num_rois + images * plane) * kBlock;
  parallel_chunks(interrupt, blocks, 1, work, [&](int64_t lo, int64_t hi) {
    Scratch& s = scratch[at::get_thread_num()];
    s.block.resize(images * plane * kBlock);  // gather_block writes every lane
    s.acc.resize(bins * kBlock);
    for (int64_t c0 = lo * kBlock; c0 < std::min(channels, hi * kBlock); c0 += kBlock) {
      const int64_t n = std::min(kBlock, channels - c0);
      gather_block(input, /*channels_last=*/false, c0, n, s.block.data());
      for (const int64_t r : order) {
        if (interrupt.stop()) return;
        const RoiTaps<T>& rt = taps.of(r, s.taps);
        const T* image = s.block.data() + rt.batch * plane * kBlock;
        for (int64_t b = 0; b < bins; ++b) {
          T* a = s.acc.data() + b * kBlock;
          std::fill(a, a + kBlock, T(0));
          for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
            const Tap<T>& tap = rt.taps[t];
            add_blend(
                a, tap.w[0], image + tap.pos[0] * kBlock, tap.w[1], image + tap.pos[1] * kBlock,
                tap.w[2], image + tap.pos[2] * kBlock, tap.w[3], image + tap.pos[3] * kBlock);
          }
        }
        for (int64_t k = 0; k < n; ++k) {  // output is [K, C, ph, pw]
          T* dst = out + (r * channels + c0 + k) * bins;
          for (int64_t b = 0; b < bins; ++b) dst[b] = s.acc[b * kBlock + k];
        }
      }
    }
  });
}

// Whether the rois read the map enough times over to pay for copying it block by block (the
// by-roi paths read only the rois' regions): the threshold of the channels-last path it
// replaces.
bool use_blocks(int64_t num_rois, int64_t channels, int64_t bins, int64_t input_numel) {
  return channels >= kBlock / 2 && num_rois * bins * channels * 4 >= input_numel;
}

// ----------------------------------------------------------------------------------- backward

// The output gradient [K, C, ph, pw], read through its strides (the grad of out.sum() is
// expanded): bin b of roi r, channel c is of(r, c)[bin_offset[b]].
template <typename T>
struct GradView {
  GradView(const at::Tensor& grad)
      : data(grad.data_ptr<T>()), s0(grad.stride(0)), s1(grad.stride(1)) {
    for (int64_t ph = 0; ph < grad.size(2); ++ph) {
      for (int64_t pw = 0; pw < grad.size(3); ++pw) bin_offset.push_back(ph * grad.stride(2) + pw * grad.stride(3));
    }
  }
  const T* of(int64_t r, int64_t c) const { return data + r * s0 + c * s1; }

  const T* data;
  int64_t s0, s1;
  std::vector<int64_t> bin_offset;
};

// Threads take blocks of kBlock channels: each zeroes its own [N, H*W, kBlock] buffer, adds every
// roi's gradient into it (rois in index order), and copies it into grad_input's channels.
template <typename T>
void roi_align_backward_blocked(
    const GradView<T>& g, const at::Tensor& rois, const RoiAlignParams& p, at::Tensor& grad_input,
    Interrupt& interrupt) {
  const int64_t num_rois = rois.size(0);
  const int64_t images = grad_input.size(0), channels = grad_input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  T* gin = grad_input.data_ptr<T>();
  SharedTaps<T> taps(rois.data_ptr<T>(), num_rois, p);
  struct Scratch {
    std::vector<T> block, grad;
    RoiTaps<T> taps;
  };
  std::vector<Scratch> scratch(at::get_num_threads());
  const int64_t blocks = (channels + kBlock - 1) / kBlock;
  const int64_t work = (roi_work(p) * num_rois + 2 * images * plane) * kBlock;
  parallel_chunks(interrupt, blocks, 1, work, [&](int64_t lo, int64_t hi) {
    Scratch& s = scratch[at::get_thread_num()];
    s.block.resize(images * plane * kBlock);
    s.grad.resize(bins * kBlock);  // [bin][channel of the block]; lanes past n stay zero
    for (int64_t c0 = lo * kBlock; c0 < std::min(channels, hi * kBlock); c0 += kBlock) {
      const int64_t n = std::min(kBlock, channels - c0);
      std::fill(s.block.begin(), s.block.end(), T(0));
      std::fill(s.grad.begin(), s.grad.end(), T(0));
      for (int64_t r = 0; r < num_rois; ++r) {
        if (interrupt.stop()) return;
        const RoiTaps<T>& rt = taps.of(r, s.taps);
        for (int64_t k = 0; k < n; ++k) {
          const T* src = g.of(r, c0 + k);
          for (int64_t b = 0; b < bins; ++b) s.grad[b * kBlock + k] = src[g.bin_offset[b]];
        }
        T* image = s.block.data() + rt.batch * plane * kBlock;
        for (int64_t b = 0; b < bins; ++b) {
          const T* gb = s.grad.data() + b * kBlock;
          for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
            const Tap<T>& tap = rt.taps[t];
            for (int q = 0; q < 4; ++q) add_scaled(image + tap.pos[q] * kBlock, tap.w[q], gb);
          }
        }
      }
      scatter_block(s.block.data(), images, channels, plane, c0, n, gin);
    }
  });
}

// Threads take channels: each zeroes the channel's planes, then adds every roi's gradient into
// them (rois in index order).
template <typename T>
void roi_align_backward_planar(
    const GradView<T>& g, const at::Tensor& rois, const RoiAlignParams& p, at::Tensor& grad_input,
    Interrupt& interrupt) {
  const int64_t num_rois = rois.size(0);
  const int64_t images = grad_input.size(0), channels = grad_input.size(1);
  const int64_t plane = p.height * p.width;
  const int64_t bins = p.pooled_height * p.pooled_width;
  T* gin = grad_input.data_ptr<T>();
  SharedTaps<T> taps(rois.data_ptr<T>(), num_rois, p);
  std::vector<RoiTaps<T>> scratch(at::get_num_threads());
  const int64_t work = roi_work(p) * num_rois + images * plane;
  parallel_chunks(interrupt, channels, chunk_for(work), work, [&](int64_t c_lo, int64_t c_hi) {
    RoiTaps<T>& own = scratch[at::get_thread_num()];
    for (int64_t c = c_lo; c < c_hi; ++c) {
      for (int64_t n = 0; n < images; ++n) {
        std::fill(gin + (n * channels + c) * plane, gin + (n * channels + c + 1) * plane, T(0));
      }
      for (int64_t r = 0; r < num_rois; ++r) {
        if (interrupt.stop()) return;
        const RoiTaps<T>& rt = taps.of(r, own);
        const Tap<T>* t_ptr = rt.taps.data();
        T* dst = gin + (rt.batch * channels + c) * plane;
        const T* src = g.of(r, c);
        for (int64_t b = 0; b < bins; ++b) {
          const T gb = src[g.bin_offset[b]];
          for (int64_t t = rt.bin_start[b]; t < rt.bin_start[b + 1]; ++t) {
            const Tap<T>& tap = t_ptr[t];
            dst[tap.pos[0]] += tap.w[0] * gb;
            dst[tap.pos[1]] += tap.w[1] * gb;
            dst[tap.pos[2]] += tap.w[2] * gb;
            dst[tap.pos[3]] += tap.w[3] * gb;
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------- the operators

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
  // Every value is written below (a roi that samples nothing gets zeros).
  auto output = at::empty({rois.size(0), input.size(1), pooled_height, pooled_width}, input.options());
  if (output.numel() == 0) {
    return output;
  }
  if (input.size(2) == 0 || input.size(3) == 0) {
    return output.zero_();
  }
  const RoiAlignParams p{spatial_scale, pooled_height, pooled_width, sampling_ratio,
                         aligned,       input.size(2), input.size(3), max_samples};
  auto rois_c = rois.contiguous();
  const int64_t bins = pooled_height * pooled_width;
  Interrupt interrupt;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "roi_align_forward_cpu", [&] {
    if (input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      // MODEL.CHANNELS_LAST: read in place, every tap a pass over contiguous channels.
      roi_align_forward_by_roi<scalar_t>(input, /*channels_last=*/true, rois_c, p, output, interrupt);
    } else if (use_blocks(rois.size(0), input.size(1), bins, input.numel())) {
      roi_align_forward_blocked<scalar_t>(input.contiguous(), rois_c, p, output, interrupt);
    } else {
      roi_align_forward_by_roi<scalar_t>(
          input.contiguous(), /*channels_last=*/false, rois_c, p, output, interrupt);
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
  // Every value is written below: the paths zero what they add into.
  auto grad_input = at::empty({batch_size, channels, height, width}, grad.options());
  const bool blocks = use_blocks(rois.size(0), channels, bins, grad_input.numel());
  Interrupt interrupt;
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "roi_align_backward_cpu", [&] {
    const GradView<scalar_t> g(grad);
    if (blocks) {
      roi_align_backward_blocked<scalar_t>(g, rois_c, p, grad_input, interrupt);
    } else {
      roi_align_backward_planar<scalar_t>(g, rois_c, p, grad_input, interrupt);
    }
  });
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_cpu));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_cpu));
}

}  // namespace detcore
