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

// Pixels copied at a time: a tile stays in the L1 cache while it is transposed.
constexpr int64_t kBlockTile = 256;

// Copies channels [c0, c0 + n) of the input into `block`, an [N, H * W, kBlock] buffer: a
// transposition of n planes for an NCHW input, a 16-channel slice of each pixel for a
// channels-last one; in tiles of pixels small enough to stay in the L1 cache.
template <typename T>
void gather_block(const at::Tensor& input, bool channels_last, int64_t c0, int64_t n, T* block) {
  const int64_t channels = input.size(1);
  const int64_t plane = input.size(2) * input.size(3);
  const T* in = input.data_ptr<T>();
  for (int64_t image = 0; image < input.size(0); ++image) {
    for (int64_t p0 = 0; p0 < plane; p0 += kBlockTile) {
      const int64_t p1 = std::min(plane, p0 + kBlockTile);
      T* dst = block + (image * plane + p0) * kBlock;
      if (channels_last) {
        const T* src = in + (image * plane + p0) * channels + c0;
        for (int64_t px = 0; px < p1 - p0; ++px) {
          std::memcpy(dst + px * kBlock, src + px * channels, n * sizeof(T));
        }
      } else {
        for (int64_t k = 0; k < n; ++k) {
          const T* src = in + (image * channels + c0 + k) * plane + p0;
          for (int64_t px = 0; px < p1 - p0; ++px) dst[px * kBlock + k] = src[px];
        }
      }
    }
  }
}

// The reverse of gather_block for an NCHW output: channels [c0, c0 + n) of `out` (contiguous
// [N, C, H, W]) from `block`, an [N, H * W, kBlock] buffer.
template <typename T>
void scatter_block(const T* block, int64_t images, int64_t channels, int64_t plane, int64_t c0, int64_t n, T* out) {
  for (int64_t image = 0; image < images; ++image) {
    for (int64_t p0 = 0; p0 < plane; p0 += kBlockTile) {
      const int64_t p1 = std::min(plane, p0 + kBlockTile);
      const T* src = block + (image * plane + p0) * kBlock;
      for (int64_t k = 0; k < n; ++k) {
        T* dst = out + (image * channels + c0 + k) * plane + p0;
        for (int64_t px = 0; px < p1 - p0; ++px) dst[px] = src[px * kBlock + k];
      }
    }
  }
}

}  // namespace detcore
