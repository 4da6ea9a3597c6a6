// The launcher of the CUDA emulation (cuda_emulation.h): blocks one at a time, each block's
// threads as real std::threads meeting at std::barriers.
#include "cuda_emulation.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cuda_emulation {
namespace {

std::mutex launch_mutex;  // one launch at a time: __shared__ statics are a single copy

// The running block's __syncthreads barrier and dynamic shared memory. Written by the launcher
// before the threads start and, between blocks, by the block-end barrier's completion step.
std::optional<std::barrier<>> block_barrier;
std::vector<unsigned char> dynamic_shared;

void check_config(dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
  // The limits of a launch on current GPUs (sm_70 and later).
  const unsigned long long threads = 1ULL * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 ||
      grid.y > 65535 || grid.z > 65535 || block.z > 64 || dynamic_shared_bytes > 48 * 1024) {
    throw std::invalid_argument(
        "emulated CUDA launch: invalid configuration (grid " + std::to_string(grid.x) + "x" +
        std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", block " +
        std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z) +
        ", " + std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory)");
  }
}

void fill_with_garbage(std::vector<unsigned char>& memory) {
  std::fill(memory.begin(), memory.end(), static_cast<unsigned char>(0xA5));
}

double timeout_seconds() {
  const char* value = std::getenv("DETCORE_EMULATION_TIMEOUT_S");
  return value != nullptr ? std::atof(value) : 300.0;
}

}  // namespace

void syncthreads() { block_barrier->arrive_and_wait(); }

void* dynamic_shared_memory() { return dynamic_shared.data(); }

void run_grid(
    dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  check_config(grid, block, dynamic_shared_bytes);
  std::lock_guard<std::mutex> one_launch(launch_mutex);
  const unsigned int threads = block.x * block.y * block.z;
  const unsigned long long blocks = 1ULL * grid.x * grid.y * grid.z;
  block_barrier.emplace(threads);
  dynamic_shared.assign(dynamic_shared_bytes, 0);
  fill_with_garbage(dynamic_shared);
  // Every thread waits here after each block; the last one to arrive sets up the next block
  // while the others wait (its threads all dropped out of the old __syncthreads barrier).
  std::barrier block_end(threads, [threads]() noexcept {
    block_barrier.emplace(threads);
    fill_with_garbage(dynamic_shared);
  });

  std::mutex done_mutex;
  std::condition_variable done;
  unsigned int finished = 0;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
      blockDim = block;
      gridDim = grid;
      for (unsigned long long b = 0; b < blocks; ++b) {
        blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / (1ULL * grid.x * grid.y));
        body();
        block_barrier->arrive_and_drop();  // returned: no longer holds up the block's barriers
        block_end.arrive_and_wait();
      }
      std::lock_guard<std::mutex> lock(done_mutex);
      ++finished;
      done.notify_one();
    });
  }
  {
    std::unique_lock<std::mutex> lock(done_mutex);
    const auto limit = std::chrono::duration<double>(timeout_seconds());
    if (!done.wait_for(lock, limit, [&] { return finished == threads; })) {
      std::fprintf(
          stderr,
          "emulated CUDA launch: not finished after %.0f s. A deadlock? (a __syncthreads() "
          "that not every thread of the block reaches)\n",
          limit.count());
      std::abort();
    }
  }
  for (std::thread& worker : workers) {
    worker.join();
  }
}

}  // namespace cuda_emulation
