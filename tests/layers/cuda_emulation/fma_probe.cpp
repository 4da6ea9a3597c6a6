// ROIAlign's device geometry (roi_align_common.h, as the CUDA kernels compile it) as a plain
// program, built by the tests with -mfma -ffp-contract=fast: g++ then fuses a * b + c into FMAs
// where it can, as nvcc does by default, and the geometry must still be the CPU kernel's.
// With -DDETCORE_FMA_PROBE_HOST it is the host geometry instead (rounded_ops.h's plain
// operators, as the CPU kernels compile it), for a build with setup.py's C++ flags and -mfma.
//   fma_probe spatial_scale pooled_h pooled_w sampling_ratio aligned  x1 y1 x2 y2 [x1 y1 x2 y2 ...]
// First line: (97 / 3 - 0.5) - (13 / 3 - 0.5) in float with plain operators: 28 when this build
// fuses a * b - c, 28.0000019 when it does not. Then one line per roi:
//   grid_h grid_w start_h start_w bin_h bin_w y x   (y, x: the last sample of the last bin)
#include <cstdio>
#include <cstdlib>

#ifndef DETCORE_FMA_PROBE_HOST
#include "cuda_emulation.h"
#endif
#include "detcore/csrc/roi_align_common.h"

namespace {

__attribute__((noinline)) float plain_height(float y1, float y2, float scale, float offset) {
  return (y2 * scale - offset) - (y1 * scale - offset);
}

__attribute__((noinline)) void print_geometry(
    const float* roi, float scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned) {
  const detcore::RoiGeometry<float> g =
      detcore::roi_geometry<float>(roi, scale, ph, pw, sampling_ratio, aligned);
  const float y = detcore::sample_coordinate(g.start_h, g.bin_h, ph - 1, g.grid_h - 1, g.grid_h);
  const float x = detcore::sample_coordinate(g.start_w, g.bin_w, pw - 1, g.grid_w - 1, g.grid_w);
  std::printf(
      "%d %d %.9g %.9g %.9g %.9g %.9g %.9g\n", g.grid_h, g.grid_w, g.start_h, g.start_w, g.bin_h,
      g.bin_w, y, x);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 10 || (argc - 6) % 4 != 0) {
    std::fprintf(stderr, "usage: %s scale ph pw sampling_ratio aligned x1 y1 x2 y2 ...\n", argv[0]);
    return 2;
  }
  const float scale = std::strtof(argv[1], nullptr);
  const int64_t ph = std::atoll(argv[2]), pw = std::atoll(argv[3]);
  const int64_t sampling_ratio = std::atoll(argv[4]);
  const bool aligned = std::atoi(argv[5]) != 0;
  volatile float y1 = 13.f, y2 = 97.f, third = 1.f / 3.f, half = 0.5f;  // not constant-folded
  std::printf("%.9g\n", plain_height(y1, y2, third, half));
  for (int a = 6; a < argc; a += 4) {
    float roi[5] = {0.f};
    for (int d = 0; d < 4; ++d) {
      roi[1 + d] = std::strtof(argv[a + d], nullptr);
    }
    print_geometry(roi, scale, ph, pw, sampling_ratio, aligned);
  }
  return 0;
}
