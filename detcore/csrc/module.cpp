// The Python module object of detcore._C. Importing it loads this library, whose static
// initializers register the detcore ops with the PyTorch dispatcher. Plain CPython API on
// purpose: pybind11 via torch/extension.h would triple this file's compile time for nothing.
#include <Python.h>

#include "argument_error_type.h"

static struct PyModuleDef detcore_c_module = {
    PyModuleDef_HEAD_INIT, "_C",
    "Compiled kernels of detcore, reached through torch.ops.detcore.*", -1, nullptr,
};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* module = PyModule_Create(&detcore_c_module);
  if (module == nullptr) {
    return nullptr;
  }
  PyObject* error_type = detcore::create_argument_error_type();
  // PyModule_AddObjectRef leaves the type's own reference alone (it must outlive the module).
  if (error_type == nullptr || PyModule_AddObjectRef(module, "OpArgumentError", error_type) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
