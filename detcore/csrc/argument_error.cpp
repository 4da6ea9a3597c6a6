// The C++ side of OpArgumentError (argument_error.h): a torch::PyTorchError, which PyTorch's
// Python bindings turn into the Python type it names, with the message unchanged.
#include "argument_error.h"

#include <torch/csrc/Exceptions.h>

#include "argument_error_type.h"

namespace detcore {
namespace {

PyObject* argument_error_type = nullptr;  // set once, when detcore._C is imported

struct ArgumentError : public torch::PyTorchError {
  using torch::PyTorchError::PyTorchError;
  PyObject* python_type() override {
    // Loaded without its Python module (torch.ops.load_library): plain ValueError.
    return argument_error_type ? argument_error_type : PyExc_ValueError;
  }
};

}  // namespace

void throw_argument_error(const std::string& message) { throw ArgumentError(message); }

PyObject* create_argument_error_type() {
  if (argument_error_type == nullptr) {
    PyObject* bases = PyTuple_Pack(2, PyExc_ValueError, PyExc_RuntimeError);
    if (bases == nullptr) {
      return nullptr;
    }
    argument_error_type = PyErr_NewExceptionWithDoc(
        "detcore._C.OpArgumentError",
        "An argument of a detcore op is invalid (shape, dtype, device or value); the message "
        "names it and what was expected. Both a ValueError and a RuntimeError, so code written "
        "for torchvision.ops (which raises RuntimeError) keeps catching it.",
        bases, nullptr);
    Py_DECREF(bases);
  }
  return argument_error_type;
}

}  // namespace detcore
