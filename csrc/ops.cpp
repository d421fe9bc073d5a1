// Host side of the CUDA kernel: argument checks, then the launch on the current stream.
//
// The Python package calls these functions directly (plain CPython functions, no dispatcher
// and no pybind11: a dispatcher round trip costs several microseconds of host time, as much
// as a decode-sized kernel) and registers `launch` as the CUDA kernel of the op whose schema
// rope_compat/ops/library.py defines (rope_compat/ops/cuda.py).
//
// Errors are raised as Python exceptions (PyErr_SetString), never as C++ exceptions: an
// exception thrown from this library and caught in torch's crashed the process at the next
// error on a machine whose compiler runtime differed from torch's build. PyTorch's stable
// ABI was the first choice of binding; its boxed calling convention costs more host time per
// call than the whole eager call takes here.
//
// The checks (checks.h) mirror rope_compat/ops/checks.py message for message. Nothing reads device
// memory, so the op never syncs the host; position bounds are enforced by the kernel, which
// leaves tokens with out-of-range positions untouched.
#include <ATen/core/Tensor.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "checks.h"
#include "mrope.h"

namespace rope_compat {
namespace {

using at::Tensor;

std::optional<Failure> run(const Tensor& positions, const Tensor& query, const Tensor* key,
         int64_t head_size, const Tensor& cache, bool is_neox, int64_t rope_dim_offset, bool inverse,
         const Tensor* offsets, const StoreArgs* store) {
  RotaryParams p{};
  KvStoreParams sp{};
  RETURN_IF_FAILED(check_rotary(positions, query, key, head_size, cache, is_neox, rope_dim_offset, inverse, offsets,
                                store, c10::DeviceType::CUDA, "the compiled kernel takes CUDA tensors only", p, sp));
  if (p.num_tokens == 0) return std::nullopt;

  // A device guard costs host time: take one only when the tensors are not on the current device.
  const c10::DeviceIndex device = positions.get_device();
  std::optional<c10::cuda::CUDAGuard> guard;
  if (device != c10::cuda::current_device()) guard.emplace(positions.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const int err = store ? launch_rotary_set_kv(p, sp, stream, device) : launch_rotary_embedding(p, stream, device);
  if (err != 0) {
    return Failure{PyExc_RuntimeError, std::string("rope_compat: CUDA kernel launch failed: ") +
                                       cudaGetErrorString(static_cast<cudaError_t>(err))};
  }
  return std::nullopt;
}

// Multimodal RoPE (mrope_rotary_embedding): the rotary checks get the temporal row of positions
// as their positions (a [T] view); here the rows' stride and the sections as given.
struct MropeArgs {
  int64_t row_stride;
  std::vector<int64_t> section;
  bool interleaved;
};

// Python's repr of a list of ints, so that messages read the same as ops/mrope.py's.
std::string list_of(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// Mirrors mrope.check_mrope_args after the rotary checks.
std::optional<Failure> check_sections(const MropeArgs& m, int64_t rot_dim, MropeParams& mp) {
  const int64_t half = rot_dim / 2;
  bool ok = m.section.size() == 3;
  int64_t sum = 0;
  for (size_t i = 0; ok && i < 3; ++i) {
    ok = m.section[i] >= 0 && m.section[i] <= half;
    sum += ok ? m.section[i] : 0;
  }
  if (!ok || sum != half) {
    return fail(PyExc_ValueError, "mrope_section: expected 3 non-negative sections summing to rot_dim / 2 = ", half,
                ", got ", list_of(m.section));
  }
  mp.positions_row_stride = m.row_stride;
  for (int i = 0; i < 3; ++i) mp.section[i] = static_cast<int32_t>(m.section[i]);
  mp.interleaved = m.interleaved;
  return std::nullopt;
}

// With `store`, mrope_rotary_embedding_set_kv: the store's checks are the plain op's (check_store).
std::optional<Failure> run_mrope(const Tensor& positions, const Tensor& query, const Tensor* key, int64_t head_size,
                                 const Tensor& cache, bool is_neox, int64_t rope_dim_offset, bool inverse,
                                 const MropeArgs& m, const StoreArgs* store) {
  RotaryParams p{};
  KvStoreParams sp{};
  RETURN_IF_FAILED(check_rotary(positions, query, key, head_size, cache, is_neox, rope_dim_offset, inverse, nullptr,
                                store, c10::DeviceType::CUDA, "the compiled kernel takes CUDA tensors only", p, sp));
  MropeParams mp{};
  RETURN_IF_FAILED(check_sections(m, cache.size(-1), mp));
  if (p.num_tokens == 0) return std::nullopt;
  const c10::DeviceIndex device = positions.get_device();
  std::optional<c10::cuda::CUDAGuard> guard;
  if (device != c10::cuda::current_device()) guard.emplace(positions.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const int err = store ? launch_mrope_set_kv(p, sp, mp, stream, device)
                        : launch_mrope_rotary_embedding(p, mp, stream, device);
  if (err != 0) {
    return Failure{PyExc_RuntimeError, std::string("rope_compat: CUDA kernel launch failed: ") +
                                       cudaGetErrorString(static_cast<cudaError_t>(err))};
  }
  return std::nullopt;
}

bool int_list_arg(PyObject* o, const char* name, std::vector<int64_t>* out) {
  PyObject* seq = (PyList_Check(o) || PyTuple_Check(o)) ? PySequence_Fast(o, name) : nullptr;
  if (seq == nullptr) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: expected a list of ints, got %s", name, type_name(o));
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  out->resize(static_cast<size_t>(n));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < n; ++i) ok = int_arg(PySequence_Fast_GET_ITEM(seq, i), name, &(*out)[i]);
  Py_DECREF(seq);
  return ok;
}

// Mirrors mrope.check_mrope_positions; sets the rows' stride. The rest are run_mrope()'s.
std::optional<Failure> check_mrope_positions(const Tensor& positions, MropeArgs& m) {
  if (!is_index_dtype(positions.scalar_type())) {
    return fail(PyExc_TypeError, "positions: expected dtype int32 or int64, got ", dtype_name(positions.scalar_type()));
  }
  if (positions.dim() != 2 || positions.size(0) != 3) {
    return fail(PyExc_ValueError, "positions: expected shape [3, num_tokens] (temporal, height, width rows) "
                "for MRoPE, got ", shape_of(positions));
  }
  if (positions.size(1) > 1 && positions.stride(1) != 1) {
    return fail(PyExc_ValueError, "positions: each row must be contiguous (stride 1 along tokens), got stride ",
                positions.stride(1));
  }
  m.row_stride = positions.stride(0);
  return std::nullopt;
}

// mrope_launch(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
//              mrope_interleaved=False, rope_dim_offset=0, inverse=False)
PyObject* mrope_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const Tensor *positions, *query, *key, *cache;
  int64_t head_size, rope_dim_offset = 0;
  bool is_neox, inverse = false;
  MropeArgs m{};
  m.interleaved = false;
  if (!count_args("mrope_rotary_embedding", nargs, 7, 10) || !tensor_arg(args[0], "positions", &positions) ||
      !tensor_arg(args[1], "query", &query) || !optional_tensor_arg(args[2], "key", &key) ||
      !int_arg(args[3], "head_size", &head_size) || !tensor_arg(args[4], "cos_sin_cache", &cache) ||
      !bool_arg(args[5], "is_neox", &is_neox) || !int_list_arg(args[6], "mrope_section", &m.section) ||
      (nargs > 7 && !bool_arg(args[7], "mrope_interleaved", &m.interleaved)) ||
      (nargs > 8 && !int_arg(args[8], "rope_dim_offset", &rope_dim_offset)) ||
      (nargs > 9 && !bool_arg(args[9], "inverse", &inverse))) {
    return nullptr;
  }
  if (auto f = check_mrope_positions(*positions, m)) return raise(*f);
  const Tensor row = positions->select(0, 0);
  if (auto f = run_mrope(row, *query, key, head_size, *cache, is_neox, rope_dim_offset, inverse, m, nullptr)) {
    return raise(*f);
  }
  Py_RETURN_NONE;
}

// mrope_set_kv_launch(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer,
//                     v_buffer, cache_loc, k_scale=None, v_scale=None, mrope_interleaved=False, rope_dim_offset=0)
PyObject* mrope_set_kv_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const Tensor *positions, *query, *key, *cache;
  int64_t head_size, rope_dim_offset = 0;
  bool is_neox;
  MropeArgs m{};
  m.interleaved = false;
  StoreArgs st{};
  if (!count_args("mrope_rotary_embedding_set_kv", nargs, 11, 15) || !tensor_arg(args[0], "positions", &positions) ||
      !tensor_arg(args[1], "query", &query) || !tensor_arg(args[2], "key", &key) ||
      !int_arg(args[3], "head_size", &head_size) || !tensor_arg(args[4], "cos_sin_cache", &cache) ||
      !bool_arg(args[5], "is_neox", &is_neox) || !int_list_arg(args[6], "mrope_section", &m.section) ||
      !tensor_arg(args[7], "value", &st.value) || !tensor_arg(args[8], "k_buffer", &st.k_buffer) ||
      !tensor_arg(args[9], "v_buffer", &st.v_buffer) || !tensor_arg(args[10], "cache_loc", &st.cache_loc) ||
      (nargs > 11 && !optional_float_arg(args[11], "k_scale", &st.has_k_scale, &st.k_scale)) ||
      (nargs > 12 && !optional_float_arg(args[12], "v_scale", &st.has_v_scale, &st.v_scale)) ||
      (nargs > 13 && !bool_arg(args[13], "mrope_interleaved", &m.interleaved)) ||
      (nargs > 14 && !int_arg(args[14], "rope_dim_offset", &rope_dim_offset))) {
    return nullptr;
  }
  if (auto f = check_mrope_positions(*positions, m)) return raise(*f);
  const Tensor row = positions->select(0, 0);
  if (auto f = run_mrope(row, *query, key, head_size, *cache, is_neox, rope_dim_offset, false, m, &st)) {
    return raise(*f);
  }
  Py_RETURN_NONE;
}


// The public entry points, bound as rope_compat.rotary_embedding and
// rope_compat.rotary_embedding_set_kv when this module loads. A positional call whose tensors
// are plain CUDA tensors, with no dispatch mode active, goes straight to the launch: no Python
// frame at all (at decode sizes a Python frame costs a visible share of the call). Every other
// call (CPU tensors, keywords, fake or other subclass tensors, dispatch modes) goes to the
// Python implementation set by set_fallback, which routes it through the registered op.
// torch.compile never runs these functions: rope_compat registers those Python
// implementations as their polyfills for tracing.
PyObject* fallback = nullptr;
PyObject* set_kv_fallback = nullptr;
PyObject* sglang_fallback = nullptr;

bool plain_cuda_call(PyObject* const* args, std::initializer_list<int> tensors) {
  if (!THPVariable_CheckExact(args[1]) || !THPVariable_Unpack(args[1]).is_cuda()) return false;
  for (const int i : tensors) {
    if (!THPVariable_CheckExact(args[i])) return false;
  }
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

PyObject* rotary_embedding(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const bool direct = kwnames == nullptr && nargs >= 6 && nargs <= 8 && plain_cuda_call(args, {0, 4}) &&
                      (args[2] == Py_None || THPVariable_CheckExact(args[2]));
  if (direct || fallback == nullptr) return launch<run>(self, args, nargs);
  return PyObject_Vectorcall(fallback, args, static_cast<size_t>(nargs), kwnames);
}

PyObject* rotary_embedding_set_kv(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const bool direct = kwnames == nullptr && nargs >= 10 && nargs <= 13 && plain_cuda_call(args, {0, 2, 4, 6, 7, 8, 9});
  if (direct || set_kv_fallback == nullptr) return set_kv_launch<run>(self, args, nargs);
  return PyObject_Vectorcall(set_kv_fallback, args, static_cast<size_t>(nargs), kwnames);
}

// A new reference (or nullptr) released at the end of its scope.
struct Ref {
  PyObject* p = nullptr;
  ~Ref() { Py_XDECREF(p); }
};

// getattr(o, name, None) without raising: 1 found, 0 absent, -1 error (set).
int optional_attr(PyObject* o, PyObject* name, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyObject_GetOptionalAttr(o, name, out);
#else
  return _PyObject_LookupAttr(o, name, out);
#endif
}

// rope_and_store(arg, positions, query, key, head_size, cos_sin_cache, is_neox): the compiled
// form of rope_compat.compat.sgl.rope_and_store (its docstring has the rules). It reads the
// arg's fields here, in the order the Python function reads them, and hands the call to
// rotary_embedding_set_kv's entry point, which launches plain CUDA calls itself and sends the
// rest to the Python op. SGLang's fused call reads these fields at every layer of every decode
// step; read in Python (two getattr calls with a default, four attribute loads) they cost about
// as much host time as the SGLang wrapper's whole frame.
PyObject* rope_and_store(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_Format(PyExc_TypeError, "rope_and_store: expected 7 positional arguments, got %zd", nargs);
    return nullptr;
  }
  if (args[3] == Py_None) {
    PyErr_SetString(PyExc_ValueError, "key: required when fused_set_kv_buffer_arg is given");
    return nullptr;
  }
  static PyObject* names[6] = {
      PyUnicode_InternFromString("k_scale"),  PyUnicode_InternFromString("v_scale"),
      PyUnicode_InternFromString("value"),    PyUnicode_InternFromString("k_buffer"),
      PyUnicode_InternFromString("v_buffer"), PyUnicode_InternFromString("cache_loc")};
  for (PyObject* n : names) {
    if (n == nullptr) return PyErr_Occurred() ? nullptr : PyErr_NoMemory();  // interning failed
  }
  Ref scale[2], field[4];
  for (int i = 0; i < 2; ++i) {
    if (optional_attr(args[0], names[i], &scale[i].p) < 0) return nullptr;
  }
  for (int i = 0; i < 4; ++i) {
    if ((field[i].p = PyObject_GetAttr(args[0], names[2 + i])) == nullptr) return nullptr;
  }
  // float(scale), as the Python function converts it (a one-element tensor syncs the host).
  for (Ref& r : scale) {
    if (r.p != nullptr && r.p != Py_None) {
      PyObject* f = PyNumber_Float(r.p);
      if (f == nullptr) return nullptr;
      Py_SETREF(r.p, f);
    }
  }
  PyObject* const call[12] = {args[1], args[2], args[3], args[4], args[5], args[6], field[0].p, field[1].p,
                              field[2].p, field[3].p, scale[0].p ? scale[0].p : Py_None,
                              scale[1].p ? scale[1].p : Py_None};
  return rotary_embedding_set_kv(self, call, 12, nullptr);
}

// apply_rope_with_cos_sin_cache_inplace(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0,
// fused_args=None): SGLang's rope call (rope_compat.sglang's function of this name, whose
// docstring has the rules), compiled. SGLang calls it with keywords at every layer of every
// decode step, and a Python frame that sorts them out costs more host time than the rest of
// the call. The common call (every argument given once, rope_dim 0, the cache a plain tensor)
// goes on from here to the rotary_embedding or rope_and_store entry, as the Python function
// would; any other call (rope_dim given, missing or unknown arguments, other objects) goes to
// that Python function, which raises its own errors.
PyObject* sglang_rope(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  enum { kQ, kK, kCache, kPositions, kNeox, kRopeDim, kFusedArgs, kSlots };
  static PyObject* names[kSlots] = {
      PyUnicode_InternFromString("q"),       PyUnicode_InternFromString("k"),
      PyUnicode_InternFromString("cos_sin_cache"), PyUnicode_InternFromString("positions"),
      PyUnicode_InternFromString("is_neox"), PyUnicode_InternFromString("rope_dim"),
      PyUnicode_InternFromString("fused_args")};
  PyObject* slot[kSlots] = {};
  bool fast = nargs <= 4;
  for (Py_ssize_t i = 0; fast && i < nargs; ++i) slot[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; fast && i < nkw; ++i) {
    // A call site's keywords are interned strings: names that are equal but not the same
    // object (and unknown or repeated ones) take the Python function's path.
    const PyObject* kw = PyTuple_GET_ITEM(kwnames, i);
    int s = 0;
    while (s < kSlots && names[s] != kw) ++s;
    fast = s < kSlots && slot[s] == nullptr;
    if (fast) slot[s] = args[nargs + i];
  }
  fast = fast && slot[kQ] && slot[kK] && slot[kCache] && slot[kPositions] && slot[kNeox] &&
         THPVariable_CheckExact(slot[kCache]) && THPVariable_Unpack(slot[kCache]).dim() >= 1;
  if (fast && slot[kRopeDim] != nullptr) {  // `not rope_dim`, for an int or bool only
    fast = (PyLong_CheckExact(slot[kRopeDim]) || PyBool_Check(slot[kRopeDim])) && PyObject_Not(slot[kRopeDim]) == 1;
  }
  if (!fast) {
    if (sglang_fallback == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, "apply_rope_with_cos_sin_cache_inplace: no fallback set");
      return nullptr;
    }
    return PyObject_Vectorcall(sglang_fallback, args, static_cast<size_t>(nargs), kwnames);
  }
  // The head size of SGLang's views is rope_dim, the cache's width.
  Ref head;
  if ((head.p = PyLong_FromLongLong(THPVariable_Unpack(slot[kCache]).size(-1))) == nullptr) return nullptr;
  if (slot[kFusedArgs] == nullptr || slot[kFusedArgs] == Py_None) {
    PyObject* const call[6] = {slot[kPositions], slot[kQ], slot[kK], head.p, slot[kCache], slot[kNeox]};
    return rotary_embedding(self, call, 6, nullptr);
  }
  PyObject* const call[7] = {slot[kFusedArgs], slot[kPositions], slot[kQ], slot[kK], head.p, slot[kCache], slot[kNeox]};
  return rope_and_store(self, call, 7);
}

// set_fallback(name, fn): where the entry point `name` sends the calls it does not launch.
PyObject* set_fallback(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  static const std::pair<const char*, PyObject**> slots[] = {{"rotary_embedding", &fallback},
                                                             {"rotary_embedding_set_kv", &set_kv_fallback},
                                                             {"apply_rope_with_cos_sin_cache_inplace", &sglang_fallback}};
  const char* name = nargs == 2 && PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8(args[0]) : nullptr;
  if (name == nullptr || !PyCallable_Check(args[1])) {
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError, "set_fallback: expected an entry point's name and a callable");
    return nullptr;
  }
  for (const auto& [entry, target] : slots) {
    if (std::strcmp(name, entry) == 0) {
      Py_INCREF(args[1]);
      Py_XSETREF(*target, args[1]);
      Py_RETURN_NONE;
    }
  }
  PyErr_Format(PyExc_ValueError, "set_fallback: no entry point %R takes a fallback", args[0]);
  return nullptr;
}

PyObject* new_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs);

template <typename F>
PyCFunction as_cfunction(F* f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

// The module's functions; the first kEntryPoints are the entry points new_entry copies.
constexpr int kEntryPoints = 4;
PyMethodDef methods[] = {
    {"rotary_embedding", as_cfunction(rotary_embedding), METH_FASTCALL | METH_KEYWORDS,
     "rotary_embedding($module, positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, "
     "inverse=False)\n--\n\n"
     "Apply rotary embedding to `query` and `key` in place, exactly as vLLM's op does.\n\n"
     "The compiled entry point of rope_compat.rotary_embedding: plain CUDA tensors passed\n"
     "positionally launch the kernel directly; any other call goes to the Python function\n"
     "rope_compat.api._python_rotary_embedding, whose docstring describes the arguments."},
    {"rotary_embedding_set_kv", as_cfunction(rotary_embedding_set_kv), METH_FASTCALL | METH_KEYWORDS,
     "rotary_embedding_set_kv($module, positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, "
     "v_buffer, cache_loc, k_scale=None, v_scale=None, rope_dim_offset=0)\n--\n\n"
     "rotary_embedding, then the rotated key and the value stored at rows cache_loc of k_buffer / v_buffer.\n\n"
     "The compiled entry point of rope_compat.rotary_embedding_set_kv: plain CUDA tensors passed\n"
     "positionally launch the kernel directly; any other call goes to the Python function\n"
     "rope_compat.api._python_rotary_embedding_set_kv, whose docstring describes the arguments."},
    {"apply_rope_with_cos_sin_cache_inplace", as_cfunction(sglang_rope), METH_FASTCALL | METH_KEYWORDS,
     "apply_rope_with_cos_sin_cache_inplace($module, q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0, "
     "fused_args=None)\n--\n\n"
     "Rotate q and k in place; with `fused_args`, also store the key and value rows (SGLang's call).\n\n"
     "The compiled form of rope_compat.sglang's function of this name, whose docstring has the rules:\n"
     "calls with rope_dim 0 and a plain cache tensor go on in C, any other call to that function."},
    {"rope_and_store", as_cfunction(rope_and_store), METH_FASTCALL,
     "rope_and_store($module, arg, positions, query, key, head_size, cos_sin_cache, is_neox, /)\n--\n\n"
     "rotary_embedding_set_kv with value, k_buffer, v_buffer, cache_loc and the optional k_scale, v_scale\n"
     "read from arg: the compiled form of rope_compat.compat.sgl.rope_and_store."},
    {"launch", as_cfunction(launch<run>), METH_FASTCALL,
     "launch(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False)\n"
     "Check the arguments and launch the kernel on the current stream (CUDA tensors)."},
    {"batched_launch", as_cfunction(batched_launch<run>), METH_FASTCALL,
     "batched_launch(positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets)\n"
     "vLLM's former multi-LoRA op: rows offsets[t] + positions[t]."},
    {"set_kv_launch", as_cfunction(set_kv_launch<run>), METH_FASTCALL,
     "set_kv_launch(positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer, cache_loc,\n"
     "k_scale=None, v_scale=None, rope_dim_offset=0)\n"
     "Rotate query and key and store the key and value at rows cache_loc of k_buffer/v_buffer, in one launch."},
    {"mrope_launch", as_cfunction(mrope_launch), METH_FASTCALL,
     "mrope_launch(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,\n"
     "mrope_interleaved=False, rope_dim_offset=0, inverse=False)\n"
     "Multimodal RoPE: positions [3, T]; pair i rotates by row positions[section(i), t]. One launch."},
    {"mrope_set_kv_launch", as_cfunction(mrope_set_kv_launch), METH_FASTCALL,
     "mrope_set_kv_launch(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value,\n"
     "k_buffer, v_buffer, cache_loc, k_scale=None, v_scale=None, mrope_interleaved=False, rope_dim_offset=0)\n"
     "Multimodal RoPE, then the key and value stored at rows cache_loc of k_buffer/v_buffer, in one launch."},
    {"set_fallback", as_cfunction(set_fallback), METH_FASTCALL,
     "set_fallback(name, fn): where the entry point `name` (rotary_embedding, rotary_embedding_set_kv or\n"
     "apply_rope_with_cos_sin_cache_inplace) sends the calls it does not launch."},
    {"new_entry", as_cfunction(new_entry), METH_FASTCALL,
     "new_entry(name, tag): a distinct function object for the entry point `name`, bound to tag."},
    {nullptr, nullptr, 0, nullptr}};

// A new function object for an entry point: the same code with an identity of its own (the
// patches rebind names by identity, and must find exactly the names they bound). Built-in
// functions compare equal when their `self` objects are the same, so the caller passes a new
// object to bind as `self` (the entry points ignore it).
PyObject* new_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const char* name = nargs == 2 && PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8(args[0]) : nullptr;
  for (int i = 0; name != nullptr && i < kEntryPoints; ++i) {
    if (std::strcmp(name, methods[i].ml_name) == 0) return PyCFunction_NewEx(&methods[i], args[1], nullptr);
  }
  PyErr_Clear();
  PyErr_SetString(PyExc_ValueError, "new_entry: expected the name of an entry point and a tag");
  return nullptr;
}

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "rope-compat CUDA kernels", -1, methods};

}  // namespace
}  // namespace rope_compat

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&rope_compat::module_def); }
