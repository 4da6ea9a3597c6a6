// The launches made by the emulated ops (emulated_launch.h), for the tests:
// torch.ops.detcore_emulated.launches() returns them, one row (grid.x, grid.y, grid.z, block.x,
// block.y, block.z, dynamic shared bytes) per launch since the previous call, and forgets them;
// torch.ops.detcore_emulated.allocations() likewise the bytes of each empty() buffer.
#include "emulated_launch.h"

#include <torch/library.h>

#include <array>
#include <mutex>
#include <vector>

namespace cuda_emulation {
namespace {

std::mutex records_mutex;
std::vector<std::array<int64_t, 7>> records;
std::vector<int64_t> allocation_records;

at::Tensor launches() {
  std::lock_guard<std::mutex> lock(records_mutex);
  at::Tensor out = at::empty({static_cast<int64_t>(records.size()), 7}, at::kLong);
  for (size_t i = 0; i < records.size(); ++i) {
    for (int k = 0; k < 7; ++k) {
      out[i][k] = records[i][k];
    }
  }
  records.clear();
  return out;
}

at::Tensor allocations() {
  std::lock_guard<std::mutex> lock(records_mutex);
  at::Tensor out = at::tensor(allocation_records, at::kLong);
  allocation_records.clear();
  return out;
}

}  // namespace

void record_allocation(int64_t bytes) {
  std::lock_guard<std::mutex> lock(records_mutex);
  allocation_records.push_back(bytes);
}

void record_launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
  std::lock_guard<std::mutex> lock(records_mutex);
  records.push_back({grid.x, grid.y, grid.z, block.x, block.y, block.z,
                     static_cast<int64_t>(dynamic_shared_bytes)});
}

}  // namespace cuda_emulation

TORCH_LIBRARY_FRAGMENT(detcore_emulated, m) {
  m.def("launches() -> Tensor", &cuda_emulation::launches);
  m.def("allocations() -> Tensor", &cuda_emulation::allocations);
}
