// Which SIMD instruction set a CPU kernel runs with. The extension is compiled for the baseline
// of its target (SSE2 on x86-64), so a kernel bound by vector arithmetic (cpu/vector_math.h) is
// also compiled into functions marked for AVX2 + FMA and for AVX-512 (GCC / Clang `target`
// attributes) and picks one at run time, as ATen does for its own kernels.
//
// DETCORE_CPU_CAPABILITY=baseline | avx2 | avx512 caps the choice (read at each call, so a test
// can run every variant on one machine); like ATEN_CPU_CAPABILITY, it never raises it above
// what the CPU has.
#pragma once

#include <cstdlib>
#include <cstring>

namespace detcore {

enum class CpuIsa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DETCORE_ISA_VARIANTS 1
#define DETCORE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define DETCORE_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))
#else
#define DETCORE_ISA_VARIANTS 0
#endif

inline CpuIsa detected_cpu_isa() {
#if DETCORE_ISA_VARIANTS
  static const CpuIsa detected = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return CpuIsa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
    return CpuIsa::kBaseline;
  }();
  return detected;
#else
  return CpuIsa::kBaseline;
#endif
}

inline CpuIsa cpu_isa() {
  CpuIsa isa = detected_cpu_isa();
  const char* cap = std::getenv("DETCORE_CPU_CAPABILITY");
  if (cap != nullptr) {
    const CpuIsa wanted = std::strcmp(cap, "baseline") == 0 ? CpuIsa::kBaseline
                          : std::strcmp(cap, "avx2") == 0   ? CpuIsa::kAvx2
                                                            : CpuIsa::kAvx512;
    isa = static_cast<int>(wanted) < static_cast<int>(isa) ? wanted : isa;
  }
  return isa;
}

inline const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 ? "avx512" : isa == CpuIsa::kAvx2 ? "avx2" : "baseline";
}

}  // namespace detcore
