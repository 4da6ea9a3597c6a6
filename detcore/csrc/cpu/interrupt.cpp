// The SIGINT hook and the Python side of Interrupt (interrupt.h).
#include "interrupt.h"
#include "work_counters.h"

#include <Python.h>

#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <pthread.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include <torch/csrc/Exceptions.h>

namespace detcore {
namespace interrupt_detail {
std::atomic<uint64_t> sigint_count{0};
}  // namespace interrupt_detail

namespace {
using interrupt_detail::sigint_count;

// The count as of the last time an op's calling thread asked Python. A SIGINT counted after it
// may be one Python has not handled yet (it came while an op was starting, or between Python's
// last check and the op's call): an op starts from this count, not from the current one, so
// that its first check asks Python (once per SIGINT, not once per op).
std::atomic<uint64_t> asked_python{0};

std::atomic<int64_t> interrupted_ops{0};  // work_counters.h

#if defined(__unix__) || defined(__APPLE__)

// The handler the hook chains to: one of the few actions ever saved, never freed (a delivery
// running on another thread may still be using the one it read).
std::atomic<const struct sigaction*> chained{nullptr};

void hook(int signum, siginfo_t* info, void* context) {
  const struct sigaction* next = chained.load(std::memory_order_acquire);
  if (next != nullptr) {
    if (next->sa_flags & SA_SIGINFO) {
      next->sa_sigaction(signum, info, context);
    } else {
      next->sa_handler(signum);
    }
  }
  // Counted after the chained handler ran: when an op sees the count move, Python's own flag
  // for the signal is already set.
  sigint_count.fetch_add(1, std::memory_order_release);
}

bool is_hook(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == hook;
}

// A handler function, not SIG_DFL (Ctrl-C ends the process anyway) or SIG_IGN (nothing comes).
bool is_function(const struct sigaction& a) {
  if (a.sa_flags & SA_SIGINFO) return a.sa_sigaction != nullptr;
  return a.sa_handler != SIG_DFL && a.sa_handler != SIG_IGN;
}

const struct sigaction* saved(const struct sigaction& a) {
  static auto* kept = new std::vector<std::unique_ptr<struct sigaction>>();  // never freed
  for (const auto& k : *kept) {
    if (k->sa_flags == a.sa_flags && std::memcmp(&k->sa_mask, &a.sa_mask, sizeof(a.sa_mask)) == 0 &&
        ((a.sa_flags & SA_SIGINFO) ? k->sa_sigaction == a.sa_sigaction
                                   : k->sa_handler == a.sa_handler)) {
      return k.get();
    }
  }
  kept->push_back(std::make_unique<struct sigaction>(a));
  return kept->back().get();
}

// Puts the hook in front of SIGINT's handler, unless it is there already or there is no handler;
// says whether it did (a SIGINT that came before was not counted).
bool ensure_hook() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  struct sigaction current;
  if (sigaction(SIGINT, nullptr, &current) != 0 || is_hook(current) || !is_function(current)) {
    return false;
  }
  chained.store(saved(current), std::memory_order_release);
  struct sigaction mine = current;  // the same mask and flags (SA_RESTART, SA_ONSTACK, ...)
  mine.sa_sigaction = hook;
  mine.sa_flags = current.sa_flags | SA_SIGINFO;
  return sigaction(SIGINT, &mine, nullptr) == 0;
}

// Forks bump this, so that a thread's cached answer below is computed again in the child.
std::atomic<uint64_t> fork_generation{0};
[[maybe_unused]] const int atfork_registered =
    pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1, std::memory_order_relaxed); });

// Whether this is the process's initial thread, where Python runs its signal handlers (and the
// thread that forked, in a child).
bool on_main_thread() {
#if defined(__linux__)
  thread_local uint64_t generation = ~uint64_t(0);
  thread_local bool main = false;
  const uint64_t now = fork_generation.load(std::memory_order_relaxed);
  if (generation != now) {
    main = syscall(SYS_gettid) == getpid();
    generation = now;
  }
  return main;
#else
  return pthread_main_np() != 0;
#endif
}

bool python_handles_signals_here() {
  return on_main_thread() && Py_IsInitialized() && PyGILState_GetThisThreadState() != nullptr;
}

#else  // no POSIX signals: an Interrupt never stops anything

bool ensure_hook() { return false; }
bool python_handles_signals_here() { return false; }

#endif

}  // namespace

int64_t interrupted_op_count() { return interrupted_ops.load(std::memory_order_relaxed); }

Interrupt::Interrupt()
    : caller_(std::this_thread::get_id()), armed_(python_handles_signals_here()), seen_(0) {
  uint64_t start = sigint_count.load(std::memory_order_acquire);
  if (armed_) {
    // Just hooked: anything earlier was not counted, so the first check asks Python anyway.
    start = ensure_hook() ? sigint_count.load(std::memory_order_acquire) - 1
                          : asked_python.load(std::memory_order_acquire);
  }
  seen_.store(start, std::memory_order_relaxed);
}

bool Interrupt::on_signal() {
  if (!on_calling_thread()) {
    return stopped_.load(std::memory_order_acquire);
  }
  const uint64_t now = sigint_count.load(std::memory_order_acquire);
  if (armed_) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    const int raised = PyErr_CheckSignals();
    asked_python.store(now, std::memory_order_release);  // every SIGINT counted is handled now
    if (raised != 0) {  // Python's handler raised: that exception ends the op
      stopped_.store(true, std::memory_order_release);
      interrupted_ops.fetch_add(1, std::memory_order_relaxed);
      python_error error;  // torch's (global namespace): Python gets the exception itself back
      error.persist();
      // What TorchScript's interpreter, which rethrows a RuntimeError, shows: say what it was.
      const std::string said = error.message;
      error.message = std::string(error.type ? reinterpret_cast<PyTypeObject*>(error.type)->tp_name
                                             : "an exception") +
                      " raised by the SIGINT handler (Ctrl-C) while a detcore op ran" +
                      (said.empty() || said == "python_error" ? "" : ": " + said);
      PyGILState_Release(gil);
      throw error;
    }
    PyGILState_Release(gil);
  }
  seen_.store(now, std::memory_order_relaxed);
  return false;
}

}  // namespace detcore
