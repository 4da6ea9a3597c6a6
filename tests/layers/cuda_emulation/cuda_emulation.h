// Just enough of CUDA for the host compiler to build and run detcore's device code
// (detcore/csrc/cuda/*_kernels.cuh) in the tests. Include it after any ATen header and before
// the kernels. Test-only.
//
// How CUDA maps onto the host:
//  - every CUDA thread of a block is a real std::thread, scheduled by the OS like any other, and
//    __syncthreads() is a std::barrier across the block's threads: a missing or misplaced
//    barrier gives a wrong result, or a data race that ThreadSanitizer reports;
//  - a few blocks of a grid run at once (DETCORE_EMULATION_BLOCKS, default 2), each with its own
//    threads, barrier and shared memory; a block that finishes takes the next one not yet run.
//    Nothing orders two running blocks, so a race between blocks (a plain += where atomics are
//    needed) is a wrong result or a ThreadSanitizer report too. Launches are serialized, as on
//    one stream;
//  - shared memory is per block: the static arrays and variables of DETCORE_SHARED_ARRAY /
//    DETCORE_SHARED_VAR (detcore/csrc/cuda/shared_memory.h) and the dynamic shared memory of
//    DETCORE_DYNAMIC_SHARED are filled with garbage before each block, so a kernel that reads
//    them before writing them (or expects zeros, or another block's values) fails. A plain
//    `__shared__` does not compile here. Static plus dynamic shared memory over 48 KiB (the
//    limit without opting in) aborts the launch, as it fails on the GPU;
//  - a thread that returns from the kernel no longer holds up its block's barriers, as on the GPU;
//  - atomicAdd is std::atomic_ref::fetch_add, atomicMin a compare-and-swap loop, and __fadd_rn
//    & co. round each operation (through a volatile, so even -ffp-contract=fast cannot fuse
//    them). Build with -ffp-contract=off: a plain a * b + c then stays two roundings, where nvcc
//    may fuse it into an FMA, which is why device code that must match the CPU bit for bit uses
//    the _rn operations;
//  - float to integer conversions: the device saturates (NaN gives 0) where the host's
//    static_cast is undefined, so device code converts through detcore/csrc/float_to_int.h, and
//    the tests build with -fsanitize=float-cast-overflow: a raw conversion out of range stops the
//    process with a report.
// Not emulated: warps (the kernels use no warp intrinsics), memory orderings weaker than a
// barrier, more than a few blocks at once (a kernel that waits for another block can deadlock
// here as on the GPU, or pass here and hang there), and registers or shared memory per SM
// (tests/layers/test_cuda_resource_usage.py reads those from the compiled kernels).
// A launch that does not finish in DETCORE_EMULATION_TIMEOUT_S seconds (default 300; a barrier
// that not every thread reaches deadlocks) aborts the process with a message, rather than hang.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>

#ifdef DETCORE_HOST_DEVICE  // rounded_ops.h would already have picked its host branch
#error "include cuda_emulation.h before detcore's headers"
#endif
#define DETCORE_CUDA_EMULATION 1
#define __global__ inline
#define __device__
#define __host__
#define __forceinline__ inline
// Shared memory is per block (see above); shared_memory.h's macros for nvcc are not defined.
#define __shared__ \
  static_assert(false, "declare shared memory with detcore/csrc/cuda/shared_memory.h's macros");
#define DETCORE_SHARED_ARRAY(type, name, count) \
  type* name = cuda_emulation::static_shared<type>(count, [] {})
#define DETCORE_SHARED_VAR(type, name) type& name = *cuda_emulation::static_shared<type>(1, [] {})
#define DETCORE_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(cuda_emulation::dynamic_shared_memory())

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
      : x(x_), y(y_), z(z_) {}
};

// Set by the launcher in each thread before it runs the kernel.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emulation {

// Runs body() in every thread of every block of the grid, as described above; throws
// std::invalid_argument for a configuration CUDA refuses (an empty grid, over 1024 threads...).
void run_grid(
    dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body);
void syncthreads();
void* dynamic_shared_memory();
// The running block's copy of the static shared memory declared at `site`.
void* static_shared_memory(const void* site, size_t bytes, size_t alignment);

// DETCORE_SHARED_ARRAY / _VAR: Site is the type of a lambda written at the declaration, so every
// declaration (in every instantiation of a kernel template) has its own `site`.
template <typename T, typename Site>
T* static_shared(size_t count, Site) {
  static const char site = 0;
  return static_cast<T*>(static_shared_memory(&site, sizeof(T) * count, alignof(T)));
}

// kernel<<<grid, block, dynamic_shared_bytes>>>(args...)
template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, Kernel kernel, Args... args) {
  run_grid(grid, block, dynamic_shared_bytes, [&] { kernel(args...); });
}

// One rounding per operation: the volatile store makes the compiler materialize the result.
template <typename T>
inline T rounded(T value) {
  volatile T result = value;
  return result;
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::syncthreads(); }

template <typename T>
inline T min(T a, T b) { return b < a ? b : a; }
template <typename T>
inline T max(T a, T b) { return a < b ? b : a; }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }

inline float atomicAdd(float* address, float value) {
  return std::atomic_ref<float>(*address).fetch_add(value);
}
inline double atomicAdd(double* address, double value) {
  return std::atomic_ref<double>(*address).fetch_add(value);
}

// CUDA's 64-bit atomicMin (compute capability 5.0 and later), as a compare-and-swap loop.
inline long long atomicMin(long long* address, long long value) {
  std::atomic_ref<long long> target(*address);
  long long old = target.load();
  while (value < old && !target.compare_exchange_weak(old, value)) {
  }
  return old;
}

inline float __fadd_rn(float a, float b) { return cuda_emulation::rounded(a + b); }
inline float __fsub_rn(float a, float b) { return cuda_emulation::rounded(a - b); }
inline float __fmul_rn(float a, float b) { return cuda_emulation::rounded(a * b); }
inline double __dadd_rn(double a, double b) { return cuda_emulation::rounded(a + b); }
inline double __dsub_rn(double a, double b) { return cuda_emulation::rounded(a - b); }
inline double __dmul_rn(double a, double b) { return cuda_emulation::rounded(a * b); }
