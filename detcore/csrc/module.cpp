// The Python module object of detcore._C. Importing it loads this library, whose static
// initializers register the detcore ops with the PyTorch dispatcher. Plain CPython API on
// purpose: pybind11 via torch/extension.h would triple this file's compile time for nothing.
#include <Python.h>

#include "argument_error_type.h"
#include "cpu/work_counters.h"
#include "value_checks.h"

// The calling thread's value-checks switch (value_checks.h), for detcore.layers.trusted_inputs.
// Plain functions, not ops: tracers (torch.compile, torch.export) never see them.
static PyObject* value_checks_enabled(PyObject*, PyObject*) {
  return PyBool_FromLong(detcore::value_checks_enabled());
}

static PyObject* set_value_checks_enabled(PyObject*, PyObject* enabled) {
  const int value = PyObject_IsTrue(enabled);
  if (value < 0) {
    return nullptr;
  }
  return PyBool_FromLong(detcore::set_value_checks_enabled(value != 0));
}

// Work counters of the CPU kernels (cpu/work_counters.h), for tests.
static PyObject* nms_iou_count(PyObject*, PyObject*) {
  return PyLong_FromLongLong(detcore::nms_iou_count());
}

static PyObject* interrupted_op_count(PyObject*, PyObject*) {
  return PyLong_FromLongLong(detcore::interrupted_op_count());
}

static PyMethodDef detcore_c_methods[] = {
    {"_value_checks_enabled", value_checks_enabled, METH_NOARGS,
     "Whether detcore's CUDA ops check argument values on this thread."},
    {"_set_value_checks_enabled", set_value_checks_enabled, METH_O,
     "Turn this thread's value checks on or off; returns the previous state."},
    {"_nms_iou_count", nms_iou_count, METH_NOARGS,
     "IoUs computed by the CPU nms and batched_nms walks in this process, so far."},
    {"_interrupted_op_count", interrupted_op_count, METH_NOARGS,
     "CPU op calls that a SIGINT handler's exception ended from inside the op, so far."},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef detcore_c_module = {
    PyModuleDef_HEAD_INIT, "_C",
    "Compiled kernels of detcore, reached through torch.ops.detcore.*", -1, detcore_c_methods,
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
