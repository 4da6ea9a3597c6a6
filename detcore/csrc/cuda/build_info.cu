// Build facts only nvcc knows: the CUDA runtime version and the GPU archs compiled in.
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#define DETCORE_STRINGIFY_(x) #x
#define DETCORE_STRINGIFY(x) DETCORE_STRINGIFY_(x)

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

}  // namespace detcore
