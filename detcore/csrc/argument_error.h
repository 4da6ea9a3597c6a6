// detcore's error for bad op arguments. In Python it is detcore.layers.OpArgumentError, a subclass
// of both ValueError (what the message describes) and RuntimeError (what torchvision's ops raise
// for the same inputs), so a caller's `except RuntimeError` keeps working after swapping
// torchvision.ops for detcore.layers. Every op argument check goes through DETCORE_CHECK_ARG.
#pragma once

#include <string>

#include <c10/macros/Macros.h>
#include <c10/util/StringUtil.h>

namespace detcore {

[[noreturn]] void throw_argument_error(const std::string& message);

}  // namespace detcore

// Like TORCH_CHECK_VALUE: the message is the remaining arguments, streamed together.
#define DETCORE_CHECK_ARG(condition, ...)                          \
  do {                                                             \
    if (C10_UNLIKELY(!(condition))) {                              \
      ::detcore::throw_argument_error(::c10::str(__VA_ARGS__));    \
    }                                                              \
  } while (false)
