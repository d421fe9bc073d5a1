// The Python binding of the compiled kernels: METH_FASTCALL functions over the CPython API
// that convert the arguments, then call the module's `run` (checks, then the kernel).
// Each module (ops.cpp for CUDA, cpu_ops.cpp for the CPU) instantiates them with its own `run`.
#pragma once

#include <torch/csrc/autograd/python_variable.h>

#include <cstring>

#include "checks.h"

namespace rope_compat {
namespace {

// Checks the arguments, then rotates (and stores, when `store` is set); a Failure to raise.
using RunFn = std::optional<Failure> (*)(const Tensor& positions, const Tensor& query, const Tensor* key,
                                         int64_t head_size, const Tensor& cache, bool is_neox,
                                         int64_t rope_dim_offset, bool inverse, const Tensor* offsets,
                                         const StoreArgs* store);

// type(o).__name__: tp_name without its module (numpy's "numpy.ndarray" is "ndarray"), as
// checks.py names a type.
const char* type_name(PyObject* o) {
  const char* name = Py_TYPE(o)->tp_name;
  const char* dot = std::strrchr(name, '.');
  return dot ? dot + 1 : name;
}

PyObject* raise(const Failure& f) {
  PyErr_SetString(f.type, f.message.c_str());
  return nullptr;
}

bool is_tensor(PyObject* o) {
  if (THPVariable_CheckExact(o)) return true;
  const int r = PyObject_IsInstance(o, THPVariableClass);
  if (r < 0) PyErr_Clear();
  return r > 0;
}

// Converters for one argument: false, with a TypeError naming the argument, on a wrong type.
bool tensor_arg(PyObject* o, const char* name, const Tensor** out) {
  if (is_tensor(o)) {
    *out = &THPVariable_Unpack(o);
    return true;
  }
  PyErr_Format(PyExc_TypeError, "%s: expected a torch.Tensor, got %s", name, type_name(o));
  return false;
}

bool optional_tensor_arg(PyObject* o, const char* name, const Tensor** out) {
  if (o == Py_None) {
    *out = nullptr;
    return true;
  }
  if (is_tensor(o)) return tensor_arg(o, name, out);
  PyErr_Format(PyExc_TypeError, "%s: expected a torch.Tensor or None, got %s", name, type_name(o));
  return false;
}

bool int_arg(PyObject* o, const char* name, int64_t* out) {
  if (PyLong_Check(o)) {
    const long long v = PyLong_AsLongLong(o);
    if (!(v == -1 && PyErr_Occurred())) {
      *out = v;
      return true;
    }
    PyErr_Clear();
  } else if (PyIndex_Check(o)) {  // e.g. numpy integers
    PyObject* i = PyNumber_Index(o);
    if (i != nullptr) {
      const bool ok = int_arg(i, name, out);
      Py_DECREF(i);
      return ok;
    }
    PyErr_Clear();
  }
  PyErr_Format(PyExc_TypeError, "%s: expected an int (64-bit), got %s", name, type_name(o));
  return false;
}

// A bool, numpy's bool, or an int as the schema's bool takes one (checks.check_bool).
bool bool_arg(PyObject* o, const char* name, bool* out) {
  const char* type = type_name(o);
  const bool ok = PyLong_Check(o) || std::strcmp(type, "bool") == 0 || std::strcmp(type, "bool_") == 0;
  const int v = ok ? PyObject_IsTrue(o) : -1;
  if (v < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: expected a bool, got %s", name, type_name(o));
    return false;
  }
  *out = v != 0;
  return true;
}

bool count_args(const char* fn, Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi) {
  if (nargs >= lo && nargs <= hi) return true;
  PyErr_Format(PyExc_TypeError, "%s: expected %zd to %zd positional arguments, got %zd", fn, lo, hi, nargs);
  return false;
}

// launch(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False)
template <RunFn run>
PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const Tensor *positions, *query, *key, *cache;
  int64_t head_size, rope_dim_offset = 0;
  bool is_neox, inverse = false;
  if (!count_args("rotary_embedding", nargs, 6, 8) || !tensor_arg(args[0], "positions", &positions) ||
      !tensor_arg(args[1], "query", &query) || !optional_tensor_arg(args[2], "key", &key) ||
      !int_arg(args[3], "head_size", &head_size) || !tensor_arg(args[4], "cos_sin_cache", &cache) ||
      !bool_arg(args[5], "is_neox", &is_neox) ||
      (nargs > 6 && !int_arg(args[6], "rope_dim_offset", &rope_dim_offset)) ||
      (nargs > 7 && !bool_arg(args[7], "inverse", &inverse))) {
    return nullptr;
  }
  if (auto f = run(*positions, *query, key, head_size, *cache, is_neox, rope_dim_offset, inverse, nullptr, nullptr)) {
    return raise(*f);
  }
  Py_RETURN_NONE;
}

// batched_launch(positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets)
template <RunFn run>
PyObject* batched_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const Tensor *positions, *query, *key, *cache, *offsets;
  int64_t head_size, rot_dim;
  bool is_neox;
  if (!count_args("batched_rotary_embedding", nargs, 8, 8) || !tensor_arg(args[0], "positions", &positions) ||
      !tensor_arg(args[1], "query", &query) || !optional_tensor_arg(args[2], "key", &key) ||
      !int_arg(args[3], "head_size", &head_size) || !tensor_arg(args[4], "cos_sin_cache", &cache) ||
      !bool_arg(args[5], "is_neox", &is_neox) || !int_arg(args[6], "rot_dim", &rot_dim) ||
      !tensor_arg(args[7], "cos_sin_cache_offsets", &offsets)) {
    return nullptr;
  }
  if (cache->dim() >= 1 && rot_dim != cache->size(-1)) {
    return raise(fail(PyExc_ValueError, "rot_dim: ", rot_dim, " must equal cos_sin_cache.shape[1] = ", cache->size(-1)));
  }
  if (auto f = run(*positions, *query, key, head_size, *cache, is_neox, 0, false, offsets, nullptr)) return raise(*f);
  Py_RETURN_NONE;
}

bool optional_float_arg(PyObject* o, const char* name, bool* has, double* out) {
  *has = o != Py_None;
  if (!*has) return true;
  if (PyFloat_Check(o) || PyLong_Check(o)) {
    *out = PyFloat_AsDouble(o);
    if (!(*out == -1.0 && PyErr_Occurred())) return true;
    PyErr_Clear();
  }
  PyErr_Format(PyExc_TypeError, "%s: expected a float or None, got %s", name, type_name(o));
  return false;
}

// set_kv_launch(positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
//               cache_loc, k_scale=None, v_scale=None, rope_dim_offset=0)
template <RunFn run>
PyObject* set_kv_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const Tensor *positions, *query, *key, *cache;
  int64_t head_size, rope_dim_offset = 0;
  bool is_neox;
  StoreArgs st{};
  if (!count_args("rotary_embedding_set_kv", nargs, 10, 13) || !tensor_arg(args[0], "positions", &positions) ||
      !tensor_arg(args[1], "query", &query) || !tensor_arg(args[2], "key", &key) ||
      !int_arg(args[3], "head_size", &head_size) || !tensor_arg(args[4], "cos_sin_cache", &cache) ||
      !bool_arg(args[5], "is_neox", &is_neox) || !tensor_arg(args[6], "value", &st.value) ||
      !tensor_arg(args[7], "k_buffer", &st.k_buffer) || !tensor_arg(args[8], "v_buffer", &st.v_buffer) ||
      !tensor_arg(args[9], "cache_loc", &st.cache_loc) ||
      (nargs > 10 && !optional_float_arg(args[10], "k_scale", &st.has_k_scale, &st.k_scale)) ||
      (nargs > 11 && !optional_float_arg(args[11], "v_scale", &st.has_v_scale, &st.v_scale)) ||
      (nargs > 12 && !int_arg(args[12], "rope_dim_offset", &rope_dim_offset))) {
    return nullptr;
  }
  if (auto f = run(*positions, *query, key, head_size, *cache, is_neox, rope_dim_offset, false, nullptr, &st)) {
    return raise(*f);
  }
  Py_RETURN_NONE;
}

}  // namespace
}  // namespace rope_compat
