// The launcher of the CUDA emulation (cuda_emulation.h): a few blocks at once, each block's
// threads real std::threads meeting at that block's std::barriers, each block its own shared
// memory.
#include "cuda_emulation.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cuda_emulation {
namespace {

constexpr size_t kSharedLimit = 48 * 1024;  // static + dynamic, without opting in
constexpr unsigned char kGarbage = 0xA5;

std::mutex launch_mutex;  // one launch at a time, as on one stream

// One of the blocks running at once: its threads run block after block, taking the next one
// of the grid when they finish (the last thread to finish a block sets up the next).
struct Slot;

struct NextBlock {
  Slot* slot;
  void operator()() noexcept;
};

struct Slot {
  Slot(unsigned int threads, size_t dynamic_bytes, std::atomic<unsigned long long>& next,
       unsigned long long blocks)
      : threads(threads), next(next), blocks(blocks), block_end(threads, NextBlock{this}) {
    dynamic_shared.assign(dynamic_bytes, kGarbage);
    arena.assign(kSharedLimit - dynamic_bytes, kGarbage);
    take_next_block();
  }

  // Between blocks (every thread of the slot waits at block_end): a fresh barrier and garbage
  // in the shared memory. `next` is relaxed: taking a block orders nothing between two slots,
  // so ThreadSanitizer still sees their accesses as unordered.
  void take_next_block() {
    block = next.fetch_add(1, std::memory_order_relaxed);
    block_barrier.emplace(threads);
    std::fill(dynamic_shared.begin(), dynamic_shared.end(), kGarbage);
    std::fill(arena.begin(), arena.begin() + static_cast<std::ptrdiff_t>(arena_used), kGarbage);
  }

  void* static_shared(const void* site, size_t bytes, size_t alignment) {
    std::lock_guard<std::mutex> lock(arena_mutex);
    for (const auto& [known, offset] : arena_offsets) {
      if (known == site) {
        return arena.data() + offset;
      }
    }
    const size_t offset = (arena_used + alignment - 1) / alignment * alignment;
    if (offset + bytes > arena.size()) {
      std::fprintf(
          stderr,
          "emulated CUDA launch: over %zu bytes of shared memory (%zu dynamic, and static arrays "
          "of at least %zu)\n",
          kSharedLimit, dynamic_shared.size(), offset + bytes);
      std::abort();
    }
    arena_offsets.emplace_back(site, offset);
    arena_used = offset + bytes;
    return arena.data() + offset;
  }

  const unsigned int threads;
  std::atomic<unsigned long long>& next;
  const unsigned long long blocks;
  unsigned long long block = 0;  // the block this slot runs now; >= blocks: none left
  std::optional<std::barrier<>> block_barrier;  // __syncthreads of the running block
  std::barrier<NextBlock> block_end;
  std::vector<unsigned char> dynamic_shared;
  // Static shared memory: each declaration's place, given when a thread first reaches it.
  std::vector<unsigned char> arena;
  std::mutex arena_mutex;
  std::vector<std::pair<const void*, size_t>> arena_offsets;
  size_t arena_used = 0;
};

void NextBlock::operator()() noexcept { slot->take_next_block(); }

thread_local Slot* current_slot = nullptr;

void check_config(dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
  // The limits of a launch on current GPUs (sm_70 and later).
  const unsigned long long threads = 1ULL * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 ||
      grid.y > 65535 || grid.z > 65535 || block.z > 64 || dynamic_shared_bytes > kSharedLimit) {
    throw std::invalid_argument(
        "emulated CUDA launch: invalid configuration (grid " + std::to_string(grid.x) + "x" +
        std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", block " +
        std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z) +
        ", " + std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory)");
  }
}

double timeout_seconds() {
  const char* value = std::getenv("DETCORE_EMULATION_TIMEOUT_S");
  return value != nullptr ? std::atof(value) : 300.0;
}

unsigned long long concurrent_blocks() {
  const char* value = std::getenv("DETCORE_EMULATION_BLOCKS");
  const long long blocks = value != nullptr ? std::atoll(value) : 2;
  return blocks < 1 ? 1 : static_cast<unsigned long long>(blocks);
}

}  // namespace

void syncthreads() { current_slot->block_barrier->arrive_and_wait(); }

void* dynamic_shared_memory() { return current_slot->dynamic_shared.data(); }

void* static_shared_memory(const void* site, size_t bytes, size_t alignment) {
  return current_slot->static_shared(site, bytes, alignment);
}

void run_grid(
    dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  check_config(grid, block, dynamic_shared_bytes);
  std::lock_guard<std::mutex> one_launch(launch_mutex);
  const unsigned int threads = block.x * block.y * block.z;
  const unsigned long long blocks = 1ULL * grid.x * grid.y * grid.z;
  const unsigned long long slot_count = std::min(blocks, concurrent_blocks());
  std::atomic<unsigned long long> next{0};
  std::vector<std::unique_ptr<Slot>> slots;
  for (unsigned long long s = 0; s < slot_count; ++s) {
    slots.push_back(std::make_unique<Slot>(threads, dynamic_shared_bytes, next, blocks));
  }

  std::mutex done_mutex;
  std::condition_variable done;
  unsigned long long finished = 0;
  std::vector<std::thread> workers;
  workers.reserve(threads * slot_count);
  for (const std::unique_ptr<Slot>& slot_ptr : slots) {
    for (unsigned int t = 0; t < threads; ++t) {
      workers.emplace_back([&, slot = slot_ptr.get(), t] {
        current_slot = slot;
        threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
        blockDim = block;
        gridDim = grid;
        while (slot->block < blocks) {
          const unsigned long long b = slot->block;
          blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / (1ULL * grid.x * grid.y));
          body();
          slot->block_barrier->arrive_and_drop();  // returned: no longer holds up the barriers
          slot->block_end.arrive_and_wait();       // the last one here takes the next block
        }
        current_slot = nullptr;
        std::lock_guard<std::mutex> lock(done_mutex);
        ++finished;
        done.notify_one();
      });
    }
  }
  {
    std::unique_lock<std::mutex> lock(done_mutex);
    const auto limit = std::chrono::duration<double>(timeout_seconds());
    if (!done.wait_for(lock, limit, [&] { return finished == workers.size(); })) {
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
