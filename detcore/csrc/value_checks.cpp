#include "value_checks.h"

namespace detcore {
namespace {
thread_local bool checks_enabled = true;
}  // namespace

bool value_checks_enabled() { return checks_enabled; }

bool set_value_checks_enabled(bool enabled) {
  const bool previous = checks_enabled;
  checks_enabled = enabled;
  return previous;
}

}  // namespace detcore
