// Build facts only nvcc knows: the CUDA runtime version and the GPU archs compiled in.
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

// Variadic: with several archs __CUDA_ARCH_LIST__ expands to "800,900", two macro arguments.
#define DETCORE_STRINGIFY_(...) #__VA_ARGS__
#define DETCORE_STRINGIFY(...) DETCORE_STRINGIFY_(__VA_ARGS__)

namespace detcore {

int64_t cuda_runtime_version_compiled() { return CUDART_VERSION; }

// nvcc defines __CUDA_ARCH_LIST__ as the comma-separated archs being built, e.g. 800,900.
std::string cuda_arch_list_compiled() {
#ifdef __CUDA_ARCH_LIST__
  return DETCORE_STRINGIFY(__CUDA_ARCH_LIST__);
#else
  return "unknown";
#endif
}

// setup.py passes the newest arch whose PTX it asks nvcc to embed (0: none), read from the
// -gencode flags: nvcc itself names no difference between a PTX and a SASS target.
int64_t cuda_ptx_arch_compiled() {
#ifdef DETCORE_CUDA_PTX_ARCH
  return DETCORE_CUDA_PTX_ARCH;
#else
  return -1;
#endif
}

}  // namespace detcore
