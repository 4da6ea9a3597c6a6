// The Python module object of detcore._C. Importing it loads this library, whose static
// initializers register the detcore ops with the PyTorch dispatcher. Plain CPython API on
// purpose: pybind11 via torch/extension.h would triple this file's compile time for nothing.
#include <Python.h>

static struct PyModuleDef detcore_c_module = {
    PyModuleDef_HEAD_INIT, "_C",
    "Compiled kernels of detcore, reached through torch.ops.detcore.*", -1, nullptr,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&detcore_c_module); }
