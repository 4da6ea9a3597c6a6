// The Python type of detcore's argument error, for module.cpp (argument_error.h has the rest).
#pragma once

#include <Python.h>

namespace detcore {

// New reference-free: the type lives as long as the process. nullptr with a Python error set
// if it could not be made.
PyObject* create_argument_error_type();

}  // namespace detcore
