// Deformable convolution (v1 and v2 "modulated") forward and backward on the CPU.
//
// An image at a time: a deformable im2col builds columns [groups, positions, taps, C / groups]
// from a channels-last copy of the image, so that each sampling point blends four contiguous
// channel vectors (one vectorized pass; the bilinear geometry is computed once per point and
// offset group, not once per channel), and one GEMM per weight group multiplies them by the
// weight, reordered to [O / groups, taps * C / groups]. Threads split the output positions.
// Backward:
//  - grad columns = weight^T . grad_out (GEMM);
//  - per position, in one pass: the columns again (for the weight gradient), and the offset and
//    mask gradients from the dot products of the grad columns with the four corner vectors;
//  - col2im: the input gradient, threads owning disjoint channel blocks (no atomics);
//  - weight gradient = grad_out . columns (GEMM), summed over images.
// float16 / bfloat16 inputs are computed in float32 and returned in their dtype.
// Threads take rows (or channel blocks) as they come free (parallel_chunks), and Ctrl-C is
// checked between them and between slices of the GEMMs (interrupt.h): one image can take seconds.
#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "../deform_conv2d_common.h"
#include "interrupt.h"
#include "parallel.h"

namespace detcore {
namespace {

struct DeformParams {
  int64_t channels, height, width, out_h, out_w, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups;
  int64_t taps() const { return kernel_h * kernel_w; }
  int64_t positions() const { return out_h * out_w; }
  int64_t group_channels() const { return channels / groups; }
};

// A channel range [c0, c1) within one weight group and one offset group.
struct Segment {
  int64_t c0, c1, group, offset_group;
};

std::vector<Segment> channel_segments(const DeformParams& p) {
  std::vector<Segment> out;
  const int64_t per_group = p.channels / p.groups;
  const int64_t per_offset_group = p.channels / p.offset_groups;
  for (int64_t c = 0; c < p.channels;) {
    const int64_t g = c / per_group;
    const int64_t og = c / per_offset_group;
    const int64_t end = std::min((g + 1) * per_group, (og + 1) * per_offset_group);
    out.push_back({c, end, g, og});
    c = end;
  }
  return out;
}

// One sampling point: its corners' pixel indices (-1 outside the map), bilinear weights, mask.
template <typename T>
struct Tap {
  int64_t pixel[4];
  T w[4];
  T ly, lx, mask;
  bool inside;
};

template <typename T>
Tap<T> make_tap(
    const T* offset, const T* mask, const DeformParams& p, int64_t og, int64_t k, int64_t pos) {
  const int64_t positions = p.positions();
  const int64_t oy = pos / p.out_w;
  const int64_t ox = pos % p.out_w;
  const int64_t i = k / p.kernel_w;
  const int64_t j = k % p.kernel_w;
  const int64_t channel = og * p.taps() + k;
  const T y = deform_coordinate<T>(
      oy * p.stride_h - p.pad_h + i * p.dilation_h, offset[2 * channel * positions + pos]);
  const T x = deform_coordinate<T>(
      ox * p.stride_w - p.pad_w + j * p.dilation_w, offset[(2 * channel + 1) * positions + pos]);
  const DeformSample<T> s = deform_sample<T>(p.height, p.width, y, x);
  Tap<T> t;
  t.inside = s.inside;
  t.ly = s.ly;
  t.lx = s.lx;
  t.mask = mask != nullptr ? mask[channel * positions + pos] : T(1);
  for (int c = 0; c < 4; ++c) {
    t.pixel[c] = s.valid[c] ? (s.y_low + (c >> 1)) * p.width + s.x_low + (c & 1) : -1;
    t.w[c] = s.w[c];
  }
  return t;
}

// Pointers to the four corner vectors of a channels-last image; outside ones read `zeros`.
template <typename T>
void corner_rows(const Tap<T>& t, const T* image, int64_t channels, const T* zeros, const T* r[4]) {
  for (int c = 0; c < 4; ++c) r[c] = t.pixel[c] >= 0 ? image + t.pixel[c] * channels : zeros;
}

// The column entries of one tap for channels [c0, c1): mask * bilinear blend.
template <typename T>
inline void write_columns(const Tap<T>& t, const T* const r[4], int64_t c0, int64_t c1, T* dst) {
  const T m = t.mask;
  const T w0 = t.w[0], w1 = t.w[1], w2 = t.w[2], w3 = t.w[3];
  const T* r0 = r[0];
  const T* r1 = r[1];
  const T* r2 = r[2];
  const T* r3 = r[3];
  for (int64_t c = c0; c < c1; ++c) {
    dst[c - c0] = m * (w0 * r0[c] + w1 * r1[c] + w2 * r2[c] + w3 * r3[c]);
  }
}

// A chunk of consecutive images, and where row `row` of its columns reads from: row =
// image_in_chunk * positions + position.
template <typename T>
struct Chunk {
  int64_t first, count;  // images [first, first + count)
  const T* images;       // channels-last [N, H * W, C]
  const T* offset;       // [N, 2 * OG * K, P]
  const T* mask;         // [N, OG * K, P] or nullptr
  int64_t rows() const { return count * positions; }
  int64_t positions, image_stride, offset_stride, mask_stride;

  const T* image(int64_t row) const { return images + (first + row / positions) * image_stride; }
  const T* offset_of(int64_t row) const {
    return offset + (first + row / positions) * offset_stride;
  }
  const T* mask_of(int64_t row) const {
    return mask != nullptr ? mask + (first + row / positions) * mask_stride : nullptr;
  }
};

// Offset of (group, row, tap k, first channel of s) in the [G, rows, K, C / G] columns.
inline int64_t column_index(
    const DeformParams& p, const Segment& s, int64_t rows, int64_t row, int64_t k) {
  return ((s.group * rows + row) * p.taps() + k) * p.group_channels() +
         (s.c0 - s.group * p.group_channels());
}

// Columns of a chunk of images, [G, rows, K, C / G].
template <typename T>
void deformable_im2col(
    const Chunk<T>& chunk, const DeformParams& p, const std::vector<Segment>& segments,
    const T* zeros, T* columns, Interrupt& interrupt) {
  const int64_t taps = p.taps();
  const int64_t rows = chunk.rows();
  const int64_t work = 4 * taps * p.channels;
  parallel_chunks(interrupt, rows, chunk_for(work), work, [&](int64_t lo, int64_t hi) {
    const T* corners[4];
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t pos = row % chunk.positions;
      const T* image = chunk.image(row);
      const T* offset = chunk.offset_of(row);
      const T* mask = chunk.mask_of(row);
      for (const Segment& s : segments) {
        for (int64_t k = 0; k < taps; ++k) {
          const Tap<T> t = make_tap(offset, mask, p, s.offset_group, k, pos);
          corner_rows(t, image, p.channels, zeros, corners);
          write_columns(t, corners, s.c0, s.c1, columns + column_index(p, s, rows, row, k));
        }
      }
    }
  });
}

// Multiply-adds of one slice of a GEMM: a GEMM over a large image runs for seconds, and Ctrl-C is
// checked between its slices.
constexpr int64_t kGemmSliceWork = int64_t(1) << 28;

// Rows of `a` per slice when a [rows, k] matrix multiplies a [k, n] one.
int64_t slice_rows(int64_t k, int64_t n) {
  return std::max<int64_t>(1, kGemmSliceWork / std::max<int64_t>(1, k * n));
}

// out = a . b, slice of rows by slice of rows (each row of the result is its own).
void mm_sliced(at::Tensor out, const at::Tensor& a, const at::Tensor& b, Interrupt& interrupt) {
  const int64_t rows = a.size(0);
  const int64_t step = slice_rows(a.size(1), b.size(1));
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    interrupt.stop();
    const int64_t n = std::min(step, rows - r0);
    at::Tensor o = out.narrow(0, r0, n);
    at::mm_out(o, a.narrow(0, r0, n), b);
  }
}

// out += a^T . b, a [rows, m] and b [rows, n], summed over slices of rows.
void add_mm_t_sliced(at::Tensor out, const at::Tensor& a, const at::Tensor& b, Interrupt& interrupt) {
  const int64_t rows = a.size(0);
  const int64_t step = slice_rows(a.size(1), b.size(1));
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    interrupt.stop();
    const int64_t n = std::min(step, rows - r0);
    out.addmm_(a.narrow(0, r0, n).t(), b.narrow(0, r0, n));
  }
}

// Images per chunk: columns of at most about kColumnBudget values (128 MB in float32; the
// backward holds their gradient too), at least one image.
constexpr int64_t kColumnBudget = int64_t(1) << 25;

int64_t images_per_chunk(const DeformParams& p, int64_t batch) {
  const int64_t per_image = std::max<int64_t>(1, p.positions() * p.taps() * p.channels);
  return std::clamp<int64_t>(kColumnBudget / per_image, 1, std::max<int64_t>(batch, 1));
}

template <typename T>
Chunk<T> make_chunk(
    const at::Tensor& image_cl, const at::Tensor& offset, const at::Tensor& mask,
    const DeformParams& p, int64_t first, int64_t count) {
  Chunk<T> c;
  c.first = first;
  c.count = count;
  c.images = image_cl.data_ptr<T>();
  c.offset = offset.data_ptr<T>();
  c.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
  c.positions = p.positions();
  c.image_stride = p.height * p.width * p.channels;
  c.offset_stride = offset.size(1) * c.positions;
  c.mask_stride = mask.defined() ? mask.size(1) * c.positions : 0;
  return c;
}

// The weight as [G, O / G, K * C / G], in the columns' (tap, channel) order.
at::Tensor weight_as_rows(const at::Tensor& weight, int64_t groups) {
  const int64_t out = weight.size(0);
  return weight.reshape({groups, out / groups, weight.size(1), weight.size(2) * weight.size(3)})
      .permute({0, 1, 3, 2})
      .reshape({groups, out / groups, -1});
}

// [N, C, H, W] as [N, H * W, C], in cache-sized tiles on all threads.
template <typename T>
at::Tensor channels_last_copy(const at::Tensor& input, Interrupt& interrupt) {
  const int64_t n = input.size(0), c = input.size(1), hw = input.size(2) * input.size(3);
  auto src = input.contiguous();
  auto dst = at::empty({n, hw, c}, input.options());
  const T* s = src.data_ptr<T>();
  T* d = dst.data_ptr<T>();
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (c + kTile - 1) / kTile;
  parallel_chunks(interrupt, n * row_tiles, chunk_for(kTile * hw), kTile * hw, [&](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / row_tiles;
      const int64_t i0 = (task % row_tiles) * kTile;
      const int64_t i1 = std::min(c, i0 + kTile);
      for (int64_t j0 = 0; j0 < hw; j0 += kTile) {
        const int64_t j1 = std::min(hw, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = j0; j < j1; ++j) d[(b * hw + j) * c + i] = s[(b * c + i) * hw + j];
        }
      }
    }
  });
  return dst;
}

DeformParams make_params(
    const DeformConvShape& s, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
    int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  return DeformParams{s.in_channels, s.height,  s.width,    s.out_h,      s.out_w,
                      s.kernel_h,    s.kernel_w, stride_h,  stride_w,     pad_h,
                      pad_w,         dilation_h, dilation_w, groups,      offset_groups};
}

bool is_reduced_float(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

c10::optional<at::Tensor> to_float(const c10::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) return t->to(at::kFloat);
  return c10::nullopt;
}

// One GEMM per weight group and chunk: [rows, K * C / G] x [K * C / G, O / G] (both operands
// row-major, MKL's fastest case here), then [rows, O] is transposed into the NCHW output.
template <typename T>
void forward_impl(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const at::Tensor& mask, const DeformParams& p, at::Tensor& output, Interrupt& interrupt) {
  const int64_t batch = input.size(0);
  const int64_t positions = p.positions();
  const int64_t cg = p.group_channels();
  const int64_t out_per_group = output.size(1) / p.groups;
  const auto segments = channel_segments(p);
  const std::vector<T> zeros(p.channels, T(0));
  const at::Tensor image_cl = channels_last_copy<T>(input, interrupt);
  const at::Tensor w_rows = weight_as_rows(weight, p.groups).contiguous();
  const int64_t per_chunk = images_per_chunk(p, batch);
  at::Tensor columns = at::empty({p.groups, per_chunk * positions, p.taps() * cg}, input.options());
  at::Tensor result = at::empty({p.groups, per_chunk * positions, out_per_group}, input.options());
  for (int64_t first = 0; first < batch; first += per_chunk) {
    const int64_t count = std::min(per_chunk, batch - first);
    const Chunk<T> chunk = make_chunk<T>(image_cl, offset, mask, p, first, count);
    at::Tensor cols = columns.narrow(1, 0, chunk.rows());
    deformable_im2col<T>(chunk, p, segments, zeros.data(), cols.data_ptr<T>(), interrupt);
    at::Tensor res = result.narrow(1, 0, chunk.rows());
    for (int64_t g = 0; g < p.groups; ++g) {
      mm_sliced(res[g], cols[g], w_rows[g].t(), interrupt);
    }
    output.narrow(0, first, count)
        .view({count, p.groups, out_per_group, positions})
        .copy_(res.view({p.groups, count, positions, out_per_group}).permute({1, 0, 3, 2}));
  }
}

at::Tensor deform_conv2d_forward_cpu(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& bias,
    int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
    int64_t dilation_w, int64_t groups, int64_t offset_groups) {
  const DeformConvShape s = check_deform_conv2d_inputs(
      "deform_conv2d", input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, groups, offset_groups);
  if (is_reduced_float(input)) {
    return deform_conv2d_forward_cpu(
               input.to(at::kFloat), weight.to(at::kFloat), offset.to(at::kFloat),
               to_float(mask), to_float(bias), stride_h, stride_w, pad_h, pad_w, dilation_h,
               dilation_w, groups, offset_groups)
        .to(input.scalar_type());
  }
  auto output = at::zeros({s.batch, s.out_channels, s.out_h, s.out_w}, input.options());
  if (output.numel() == 0) {
    return output;
  }
  const DeformParams p = make_params(
      s, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups);
  const at::Tensor mask_c =
      mask.has_value() && mask->defined() ? mask->contiguous() : at::Tensor();
  const at::Tensor offset_c = offset.contiguous();
  Interrupt interrupt;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "deform_conv2d_forward_cpu", [&] {
    forward_impl<scalar_t>(input, weight, offset_c, mask_c, p, output, interrupt);
  });
  if (bias.has_value() && bias->defined()) {
    output.add_(bias->view({1, s.out_channels, 1, 1}));
  }
  return output;
}

// Per row (image, position), for every offset group and tap: its Tap (kept for col2im), its
// columns (for the weight gradient), and the offset and mask gradients, from the dot products of
// the grad columns with the four corner vectors.
template <typename T>
void columns_and_coordinate_grads(
    const Chunk<T>& chunk, const T* grad_columns, const DeformParams& p,
    const std::vector<Segment>& segments, const T* zeros, Tap<T>* taps, T* columns,
    T* grad_offset, T* grad_mask, Interrupt& interrupt) {
  const int64_t k_taps = p.taps();
  const int64_t positions = p.positions();
  const int64_t rows = chunk.rows();
  const int64_t work = 12 * k_taps * p.channels;
  parallel_chunks(interrupt, rows, chunk_for(work), work, [&](int64_t lo, int64_t hi) {
    const T* corners[4];
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t pos = row % positions;
      const int64_t n = chunk.first + row / positions;
      const T* image = chunk.image(row);
      const T* offset = chunk.offset_of(row);
      const T* mask = chunk.mask_of(row);
      T* g_offset = grad_offset + n * chunk.offset_stride;
      T* g_mask = grad_mask != nullptr ? grad_mask + n * chunk.mask_stride : nullptr;
      for (int64_t og = 0; og < p.offset_groups; ++og) {
        for (int64_t k = 0; k < k_taps; ++k) {
          const Tap<T> t = make_tap(offset, mask, p, og, k, pos);
          taps[(row * p.offset_groups + og) * k_taps + k] = t;
          corner_rows(t, image, p.channels, zeros, corners);
          T dot[4] = {T(0), T(0), T(0), T(0)};  // over the offset group's channels
          for (const Segment& s : segments) {
            if (s.offset_group != og) continue;
            const int64_t at = column_index(p, s, rows, row, k);
            write_columns(t, corners, s.c0, s.c1, columns + at);
            const T* g = grad_columns + at - s.c0;
            const T* r0 = corners[0];
            const T* r1 = corners[1];
            const T* r2 = corners[2];
            const T* r3 = corners[3];
            T d0 = 0, d1 = 0, d2 = 0, d3 = 0;
            for (int64_t c = s.c0; c < s.c1; ++c) {
              d0 += g[c] * r0[c];
              d1 += g[c] * r1[c];
              d2 += g[c] * r2[c];
              d3 += g[c] * r3[c];
            }
            dot[0] += d0;
            dot[1] += d1;
            dot[2] += d2;
            dot[3] += d3;
          }
          T gy = 0, gx = 0, gm = 0;
          if (t.inside) {
            DeformSample<T> sample;
            sample.ly = t.ly;
            sample.lx = t.lx;
            T dwy[4], dwx[4];
            deform_weight_derivatives(sample, dwy, dwx);
            for (int c = 0; c < 4; ++c) {
              if (t.pixel[c] < 0) continue;  // a zero outside the map: no gradient
              gy += dwy[c] * dot[c];
              gx += dwx[c] * dot[c];
              gm += t.w[c] * dot[c];
            }
          }
          const int64_t channel = og * k_taps + k;
          g_offset[2 * channel * positions + pos] = t.mask * gy;
          g_offset[(2 * channel + 1) * positions + pos] = t.mask * gx;
          if (g_mask != nullptr) g_mask[channel * positions + pos] = gm;
        }
      }
    }
  });
}

// Scatters the grad columns of a chunk into the channels-last input gradient [N, H * W, C].
// Threads own disjoint channel blocks: no two ever write the same value, no atomics.
template <typename T>
void deformable_col2im(
    const Chunk<T>& chunk, const Tap<T>* taps, const T* grad_columns, const DeformParams& p,
    const std::vector<Segment>& segments, T* grad_images, Interrupt& interrupt) {
  const int64_t k_taps = p.taps();
  const int64_t rows = chunk.rows();
  const int64_t threads = at::get_num_threads();
  const int64_t width =
      std::max<int64_t>(16, ((p.channels + threads - 1) / threads + 15) / 16 * 16);
  const int64_t blocks = (p.channels + width - 1) / width;
  parallel_chunks(interrupt, blocks, 1, 4 * rows * k_taps * width, [&](int64_t blo, int64_t bhi) {
    const int64_t b0 = blo * width;
    const int64_t b1 = std::min(p.channels, bhi * width);
    for (const Segment& s : segments) {
      const int64_t c0 = std::max(s.c0, b0);
      const int64_t c1 = std::min(s.c1, b1);
      if (c0 >= c1) continue;
      for (int64_t row = 0; row < rows; ++row) {
        if (row % 16 == 0 && interrupt.stop()) return;
        T* image = grad_images + (chunk.first + row / chunk.positions) * chunk.image_stride;
        for (int64_t k = 0; k < k_taps; ++k) {
          const Tap<T>& t = taps[(row * p.offset_groups + s.offset_group) * k_taps + k];
          const T* g = grad_columns + column_index(p, s, rows, row, k) - s.c0;
          for (int corner = 0; corner < 4; ++corner) {
            if (t.pixel[corner] < 0) continue;
            const T w = t.mask * t.w[corner];
            T* dst = image + t.pixel[corner] * p.channels;
            for (int64_t c = c0; c < c1; ++c) dst[c] += w * g[c];
          }
        }
      }
    }
  });
}

template <typename T>
void backward_impl(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const at::Tensor& mask, const DeformParams& p,
    at::Tensor& grad_input, at::Tensor& grad_weight, at::Tensor& grad_offset,
    at::Tensor& grad_mask, Interrupt& interrupt) {
  const int64_t batch = input.size(0);
  const int64_t positions = p.positions();
  const int64_t taps = p.taps();
  const int64_t cg = p.group_channels();
  const int64_t out_per_group = grad.size(1) / p.groups;
  const auto segments = channel_segments(p);
  const std::vector<T> zeros(p.channels, T(0));
  const at::Tensor image_cl = channels_last_copy<T>(input, interrupt);
  at::Tensor grad_image_cl = at::zeros_like(image_cl);
  const at::Tensor w_rows = weight_as_rows(weight, p.groups).contiguous();
  at::Tensor grad_w_rows = at::zeros_like(w_rows);
  const int64_t per_chunk = images_per_chunk(p, batch);
  at::Tensor columns = at::empty({p.groups, per_chunk * positions, taps * cg}, input.options());
  at::Tensor grad_columns = at::empty_like(columns);
  at::Tensor grad_rows = at::empty({p.groups, per_chunk * positions, out_per_group}, input.options());
  std::vector<Tap<T>> tap_buffer(per_chunk * positions * p.offset_groups * taps);
  for (int64_t first = 0; first < batch; first += per_chunk) {
    const int64_t count = std::min(per_chunk, batch - first);
    const Chunk<T> chunk = make_chunk<T>(image_cl, offset, mask, p, first, count);
    const int64_t rows = chunk.rows();
    // grad as [G, rows, O / G], then grad columns = grad . weight rows.
    at::Tensor g_rows = grad_rows.narrow(1, 0, rows);
    g_rows.view({p.groups, count, positions, out_per_group})
        .copy_(grad.narrow(0, first, count)
                   .view({count, p.groups, out_per_group, positions})
                   .permute({1, 0, 3, 2}));
    at::Tensor gcols = grad_columns.narrow(1, 0, rows);
    at::Tensor cols = columns.narrow(1, 0, rows);
    for (int64_t g = 0; g < p.groups; ++g) {
      mm_sliced(gcols[g], g_rows[g], w_rows[g], interrupt);
    }
    columns_and_coordinate_grads<T>(
        chunk, gcols.data_ptr<T>(), p, segments, zeros.data(), tap_buffer.data(),
        cols.data_ptr<T>(), grad_offset.data_ptr<T>(),
        mask.defined() ? grad_mask.data_ptr<T>() : nullptr, interrupt);
    deformable_col2im<T>(
        chunk, tap_buffer.data(), gcols.data_ptr<T>(), p, segments, grad_image_cl.data_ptr<T>(),
        interrupt);
    for (int64_t g = 0; g < p.groups; ++g) {
      add_mm_t_sliced(grad_w_rows[g], g_rows[g], cols[g], interrupt);
    }
  }
  // [N, H * W, C] -> [N, C, H, W]; [G, O / G, K, C / G] -> [O, C / G, kh, kw]
  grad_input.copy_(
      grad_image_cl.view({batch, p.height, p.width, p.channels}).permute({0, 3, 1, 2}));
  grad_weight.copy_(grad_w_rows.view({p.groups, out_per_group, taps, cg})
                        .permute({0, 1, 3, 2})
                        .reshape(grad_weight.sizes()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_cpu(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
    int64_t offset_groups) {
  const DeformConvShape s = check_deform_conv2d_backward_inputs(
      grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w, groups, offset_groups);
  const bool has_mask = mask.has_value() && mask->defined();
  if (is_reduced_float(input)) {
    auto r = deform_conv2d_backward_cpu(
        grad.to(at::kFloat), input.to(at::kFloat), weight.to(at::kFloat), offset.to(at::kFloat),
        to_float(mask), to_float(bias), stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
        groups, offset_groups);
    const auto dtype = input.scalar_type();
    return {std::get<0>(r).to(dtype), std::get<1>(r).to(dtype), std::get<2>(r).to(dtype),
            std::get<3>(r).to(dtype), std::get<4>(r).to(dtype)};
  }
  auto grad_input = at::zeros_like(input, at::MemoryFormat::Contiguous);
  auto grad_weight = at::zeros_like(weight, at::MemoryFormat::Contiguous);
  auto grad_offset = at::zeros_like(offset, at::MemoryFormat::Contiguous);
  auto grad_mask = has_mask ? at::zeros_like(*mask, at::MemoryFormat::Contiguous)
                            : at::zeros({0}, input.options());
  auto grad_bias = grad.sum(at::IntArrayRef{0, 2, 3});
  if (grad.numel() == 0 || input.numel() == 0) {
    return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
  }
  const DeformParams p = make_params(
      s, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups);
  const at::Tensor mask_c = has_mask ? mask->contiguous() : at::Tensor();
  const at::Tensor offset_c = offset.contiguous();
  const at::Tensor grad_c = grad.contiguous();
  Interrupt interrupt;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "deform_conv2d_backward_cpu", [&] {
    backward_impl<scalar_t>(
        grad_c, input, weight, offset_c, mask_c, p, grad_input, grad_weight, grad_offset,
        grad_mask, interrupt);
  });
  return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_forward_cpu));
  m.impl("_deform_conv2d_backward", TORCH_FN(deform_conv2d_backward_cpu));
}

}  // namespace detcore
