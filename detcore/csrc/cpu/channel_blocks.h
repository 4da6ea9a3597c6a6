// The feature map in blocks of kBlock channels: the CPU kernels of ROIPool and ROIAlign copy one
// block at a time into an [N, H * W, kBlock] buffer that stays in the cache while every roi reads
// (or, for a gradient, writes) it, a pixel's kBlock channels contiguous for vector registers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <ATen/ATen.h>

namespace detcore {

constexpr int64_t kBlock = 16;  // channels per block

// Copies channels [c0, c0 + n) of the input into `block`, an [N, H * W, kBlock] buffer (lanes
// past n hold copies of channel c0 + n - 1): a 16-channel slice of each pixel for a channels-last
// input; for an NCHW one a transposition of the n planes, pixel by pixel, so that the stores are
// contiguous (faster than plane by plane, whose stores each touch another cache line).
template <typename T>
void gather_block(const at::Tensor& input, bool channels_last, int64_t c0, int64_t n, T* block) {
  const int64_t channels = input.size(1);
  const int64_t plane = input.size(2) * input.size(3);
  const T* in = input.data_ptr<T>();
  for (int64_t image = 0; image < input.size(0); ++image) {
    T* dst = block + image * plane * kBlock;
    if (channels_last) {
      const T* src = in + image * plane * channels + c0;
      for (int64_t px = 0; px < plane; ++px) {
        std::memcpy(dst + px * kBlock, src + px * channels, n * sizeof(T));
      }
      continue;
    }
    const T* src[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) {
      src[k] = in + (image * channels + c0 + std::min(k, n - 1)) * plane;
    }
    for (int64_t px = 0; px < plane; ++px) {
      T* d = dst + px * kBlock;
      for (int64_t k = 0; k < kBlock; ++k) d[k] = src[k][px];
    }
  }
}

// The reverse of gather_block for an NCHW output: channels [c0, c0 + n) of `out` (contiguous
// [N, C, H, W]) from `block`, an [N, H * W, kBlock] buffer, pixel by pixel.
template <typename T>
void scatter_block(
    const T* block, int64_t images, int64_t channels, int64_t plane, int64_t c0, int64_t n, T* out) {
  for (int64_t image = 0; image < images; ++image) {
    const T* src = block + image * plane * kBlock;
    T* dst[kBlock] = {};
    for (int64_t k = 0; k < n; ++k) dst[k] = out + (image * channels + c0 + k) * plane;
    if (n == kBlock) {
      for (int64_t px = 0; px < plane; ++px) {
        for (int64_t k = 0; k < kBlock; ++k) dst[k][px] = src[px * kBlock + k];
      }
    } else {
      for (int64_t px = 0; px < plane; ++px) {
        for (int64_t k = 0; k < n; ++k) dst[k][px] = src[px * kBlock + k];
      }
    }
  }
}

// The arithmetic on a pixel's kBlock channels, lane by lane, written with the compiler's vector
// types: the auto-vectorizer left these loops scalar (it kept the 16 values in scalar registers).
// Each lane computes exactly what the scalar expression in the comment computes, in its order.
#if defined(__GNUC__)
template <typename T>
struct BlockLanes {
  static constexpr int kWidth = 16 / sizeof(T);
  typedef T Vec __attribute__((vector_size(16)));
  static Vec load(const T* p) {
    Vec v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static void store(T* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }
};

// acc[k] += w0 * p0[k] + w1 * p1[k] + w2 * p2[k] + w3 * p3[k]
template <typename T>
inline void add_blend(T* acc, T w0, const T* p0, T w1, const T* p1, T w2, const T* p2, T w3, const T* p3) {
  using L = BlockLanes<T>;
  for (int64_t k = 0; k < kBlock; k += L::kWidth) {
    L::store(acc + k, L::load(acc + k) + (w0 * L::load(p0 + k) + w1 * L::load(p1 + k) +
                                          w2 * L::load(p2 + k) + w3 * L::load(p3 + k)));
  }
}

// row[k] += w * g[k]
template <typename T>
inline void add_scaled(T* row, T w, const T* g) {
  using L = BlockLanes<T>;
  for (int64_t k = 0; k < kBlock; k += L::kWidth) {
    L::store(row + k, L::load(row + k) + w * L::load(g + k));
  }
}
#else
template <typename T>
inline void add_blend(T* acc, T w0, const T* p0, T w1, const T* p1, T w2, const T* p2, T w3, const T* p3) {
  for (int64_t k = 0; k < kBlock; ++k) acc[k] += w0 * p0[k] + w1 * p1[k] + w2 * p2[k] + w3 * p3[k];
}

template <typename T>
inline void add_scaled(T* row, T w, const T* g) {
  for (int64_t k = 0; k < kBlock; ++k) row[k] += w * g[k];
}
#endif

}  // namespace detcore
