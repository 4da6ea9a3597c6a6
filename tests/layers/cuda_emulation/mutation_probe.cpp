// detcore's device code under the CUDA emulation as a plain program (no ATen), for the mutation
// tests (tests/layers/test_cuda_emulation_mutations.py): built from the real headers, and from
// copies with one mutation each, with ThreadSanitizer and the float-cast check, to show that the
// emulation catches what the mutation breaks. Numbers are read from stdin, results printed.
//   mutation_probe convert                 stdin: values; prints float_to_int of each, as
//                                          int32 from float, int32 from double, int64 from float,
//                                          int64 from double
//   mutation_probe roi_grid                stdin: scale pooled_h pooled_w aligned, then rois
//                                          (batch x1 y1 x2 y2); prints batch grid_h grid_w of
//                                          each (roi_align_common.h, adaptive sampling)
//   mutation_probe nms_mask                stdin: n, then n boxes; prints the plain NMS mask
//                                          words (threshold 0.5) of the rows' own and later
//                                          column blocks, row by row
//   mutation_probe roi_pool_backward K S   grad_input of K rois of one 1x1 bin each, roi k's
//                                          maximum at pixel k % (S * S) of an S x S map, grad 1
//   mutation_probe block_sum               stdin: values; prints their sum by the focal loss's
//                                          one-block sum kernel
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emulation.h"
#include "detcore/csrc/cuda/launch_config.h"
#include "detcore/csrc/cuda/nms_kernels.cuh"
#include "detcore/csrc/cuda/roi_pool_kernels.cuh"
#include "detcore/csrc/cuda/sigmoid_focal_loss_kernels.cuh"
#include "detcore/csrc/float_to_int.h"
#include "detcore/csrc/roi_align_common.h"

namespace {

std::vector<double> read_numbers() {
  std::vector<double> values;
  char token[64];
  while (std::scanf("%63s", token) == 1) {
    values.push_back(std::strtod(token, nullptr));  // also "nan", "inf", "-inf"
  }
  return values;
}

int convert() {
  for (const double v : read_numbers()) {
    const float f = static_cast<float>(v);
    std::printf(
        "%d %d %lld %lld\n", detcore::float_to_int<int>(f), detcore::float_to_int<int>(v),
        static_cast<long long>(detcore::float_to_int<int64_t>(f)),
        static_cast<long long>(detcore::float_to_int<int64_t>(v)));
  }
  return 0;
}

int roi_grid() {
  const std::vector<double> v = read_numbers();
  const float scale = static_cast<float>(v.at(0));
  const int64_t pooled_h = static_cast<int64_t>(v.at(1));
  const int64_t pooled_w = static_cast<int64_t>(v.at(2));
  const bool aligned = v.at(3) != 0;
  for (size_t i = 4; i + 5 <= v.size(); i += 5) {
    float roi[5];
    for (int k = 0; k < 5; ++k) {
      roi[k] = static_cast<float>(v[i + k]);
    }
    const detcore::RoiGeometry<float> g =
        detcore::roi_geometry<float>(roi, scale, pooled_h, pooled_w, 0, aligned);
    std::printf("%lld %d %d\n", static_cast<long long>(g.batch), g.grid_h, g.grid_w);
  }
  return 0;
}

int nms_mask() {
  const std::vector<double> v = read_numbers();
  const int64_t n = static_cast<int64_t>(v.at(0));
  std::vector<float> boxes(v.begin() + 1, v.begin() + 1 + 4 * n);
  const detcore::NmsLaunch launch = detcore::nms_launch(n);
  std::vector<unsigned long long> mask(n * launch.col_blocks, 0x5A5A5A5A5A5A5A5AULL);
  cuda_emulation::launch(
      dim3(launch.grid_x, launch.grid_y), dim3(detcore::kBlockBoxes), 0,
      detcore::nms_mask_kernel<float, float>, n, launch.col_blocks,
      static_cast<const float*>(boxes.data()), static_cast<const int64_t*>(nullptr), 0.5,
      mask.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t cb = i / detcore::kBlockBoxes; cb < launch.col_blocks; ++cb) {
      std::printf("%llu ", mask[i * launch.col_blocks + cb]);
    }
    std::printf("\n");
  }
  return 0;
}

int roi_pool_backward(int64_t rois, int64_t side) {
  std::vector<float> grad(rois, 1.0f), roi_values(rois * 5, 0.0f);
  std::vector<int32_t> argmax(rois);
  for (int64_t k = 0; k < rois; ++k) {
    argmax[k] = static_cast<int32_t>(k % (side * side));
  }
  std::vector<float> grad_input(side * side, 0.0f);
  cuda_emulation::launch(
      dim3(detcore::roi_pool_blocks(rois)), dim3(detcore::kRoiPoolThreads), 0,
      detcore::roi_pool_backward_kernel<float, float>, rois,
      static_cast<const float*>(grad.data()), int64_t(1), int64_t(1), int64_t(1), int64_t(1),
      static_cast<const int32_t*>(argmax.data()), static_cast<const float*>(roi_values.data()),
      int64_t(1), int64_t(1), side, side, int64_t(1), int64_t(1), grad_input.data());
  for (const float value : grad_input) {
    std::printf("%.9g\n", value);
  }
  return 0;
}

int block_sum() {
  const std::vector<double> values = read_numbers();
  double out = 0;
  cuda_emulation::launch(
      dim3(1), dim3(detcore::kFocalLossThreads), 0, detcore::sigmoid_focal_loss_sum_kernel<double>,
      static_cast<int64_t>(values.size()), values.data(), 1.0, &out);
  std::printf("%.17g\n", out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "convert") return convert();
  if (command == "roi_grid") return roi_grid();
  if (command == "nms_mask") return nms_mask();
  if (command == "roi_pool_backward" && argc == 4) {
    return roi_pool_backward(std::atoll(argv[2]), std::atoll(argv[3]));
  }
  if (command == "block_sum") return block_sum();
  std::fprintf(stderr, "usage: see the comment at the top of mutation_probe.cpp\n");
  return 2;
}
