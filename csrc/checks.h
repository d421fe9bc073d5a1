// Argument checks of the rotary ops for the compiled kernels (CUDA: ops.cpp, CPU: cpu_ops.cpp).
//
// They mirror rope_compat/ops/checks.py and ops/kv_store.py message for message, and report an
// error as the Python exception type and message to raise (see ops.cpp for why never a C++
// exception). Nothing here reads tensor data; the CPU kernel checks position bounds itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <Python.h>

#include <cmath>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "fused_kv_store.h"
#include "rotary_embedding.h"

namespace rope_compat {
namespace {

using at::Tensor;
using c10::ScalarType;

// An argument error: the Python exception type to raise (PyExc_*) and its message.
struct Failure {
  PyObject* type;
  std::string message;
};

// Messages are built without iostreams: formatting a number through std::ostream crashed the
// process where torch and this library had different C++ runtimes (their locale facets differ).
inline void append(std::string& out, const char* s) { out += s; }
inline void append(std::string& out, const std::string& s) { out += s; }
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
inline void append(std::string& out, Int v) { out += std::to_string(v); }

template <typename... Args>
Failure fail(PyObject* type, const Args&... args) {
  std::string message;
  (append(message, args), ...);
  return Failure{type, std::move(message)};
}

#define RETURN_IF_FAILED(expr)          \
  do {                                  \
    if (auto f_ = (expr)) return f_;    \
  } while (0)

// Python's tuple repr, so that messages read the same as checks.py's.
std::string shape_of(c10::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t d = 0; d < sizes.size(); ++d) out += (d ? ", " : "") + std::to_string(sizes[d]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}
std::string shape_of(const Tensor& t) { return shape_of(t.sizes()); }

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    // The rest as str(dtype) prints them, so a rejection reads the same as checks.py's.
    case ScalarType::Float8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case ScalarType::Float8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::UInt16: return "torch.uint16";
    case ScalarType::UInt32: return "torch.uint32";
    case ScalarType::UInt64: return "torch.uint64";
    case ScalarType::Bool: return "torch.bool";
    case ScalarType::ComplexHalf: return "torch.complex32";
    case ScalarType::ComplexFloat: return "torch.complex64";
    case ScalarType::ComplexDouble: return "torch.complex128";
    default: return "an unsupported dtype";
  }
}

std::optional<DType> float_dtype(ScalarType t, bool allow_double) {
  switch (t) {
    case ScalarType::Float: return DType::kFloat32;
    case ScalarType::Half: return DType::kFloat16;
    case ScalarType::BFloat16: return DType::kBFloat16;
    case ScalarType::Double:
      if (allow_double) return DType::kFloat64;
      return std::nullopt;
    default: return std::nullopt;
  }
}

bool is_index_dtype(ScalarType t) { return t == ScalarType::Int || t == ScalarType::Long; }

struct Layout {
  int64_t heads, batch_stride, token_stride, head_stride;
};

// Mirrors checks._heads: the layout of q or k relative to positions.
std::optional<Failure> heads_layout(const char* name, const Tensor& x, const Tensor& positions,
                                    int64_t head_size, Layout& l) {
  const int64_t pd = positions.dim();
  if (x.dim() != pd + 1 && x.dim() != pd + 2) {
    return fail(PyExc_ValueError, name, ": expected ", pd + 1, " dims [*positions.shape, heads * head_size] or ",
         pd + 2, " dims [*positions.shape, heads, head_size], got shape ", shape_of(x));
  }
  for (int64_t d = 0; d < pd; ++d) {
    if (x.size(d) != positions.size(d)) {
      return fail(PyExc_ValueError, name, ": leading dims ", shape_of(x.sizes().slice(0, pd)),
           " must match positions.shape ", shape_of(positions), " (the same number of tokens)");
    }
  }
  if (x.dim() == pd + 2) {
    if (x.size(-1) != head_size) {
      return fail(PyExc_ValueError, name, ": last dim is ", x.size(-1), ", expected head_size=", head_size);
    }
    l.heads = x.size(-2);
    l.head_stride = x.stride(-2);
  } else {
    if (x.size(-1) % head_size != 0) {
      return fail(PyExc_ValueError, name, ": hidden size ", x.size(-1), " is not divisible by head_size=", head_size);
    }
    l.heads = x.size(-1) / head_size;
    l.head_stride = head_size;
  }
  if (x.numel() > 0 && x.stride(-1) != 1) {
    return fail(PyExc_ValueError, name, ": last dim must be contiguous (stride 1), got stride ", x.stride(-1));
  }
  l.batch_stride = pd == 2 ? x.stride(0) : 0;
  l.token_stride = x.stride(pd - 1);
  return std::nullopt;
}

std::optional<Failure> check_device(const char* name, const Tensor& t, const Tensor& positions) {
  if (t.device() != positions.device()) {
    return fail(PyExc_ValueError, name, ": on device ", t.device().str(), ", but positions is on ",
                positions.device().str(),
         "; all tensors must be on one device");
  }
  return std::nullopt;
}

// The KV-cache store of rotary_embedding_set_kv: its tensors and scales (NaN: no scale).
struct StoreArgs {
  const Tensor* value;
  const Tensor* k_buffer;
  const Tensor* v_buffer;
  const Tensor* cache_loc;
  double k_scale, v_scale;
  bool has_k_scale, has_v_scale;
};

std::optional<BufferDType> buffer_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return BufferDType::kFloat32;
    case ScalarType::Half: return BufferDType::kFloat16;
    case ScalarType::BFloat16: return BufferDType::kBFloat16;
    case ScalarType::Double: return BufferDType::kFloat64;
    case ScalarType::Float8_e4m3fn: return BufferDType::kFloat8E4M3;
    case ScalarType::Float8_e5m2: return BufferDType::kFloat8E5M2;
    default: return std::nullopt;
  }
}

// Mirrors kv_store._buffer_layout: rows, row stride and head stride of a KV buffer.
std::optional<Failure> buffer_layout(const char* name, const Tensor& buf, int64_t kv_heads, int64_t head_size,
                                     int64_t& rows, int64_t& row_stride, int64_t& head_stride) {
  const int64_t dim = buf.dim();
  auto expected = [&] {
    return fail(PyExc_ValueError, name, ": expected [rows, heads * head_size], [rows, heads, head_size] or "
                "[pages, page_size, heads, head_size] with heads=", kv_heads, ", head_size=", head_size,
                ", got shape ", shape_of(buf));
  };
  if (dim == 2) {
    if (buf.size(1) != kv_heads * head_size) return expected();
    rows = buf.size(0);
    row_stride = buf.stride(0);
    head_stride = head_size;
  } else if (dim == 3 || dim == 4) {
    if (buf.size(-1) != head_size || buf.size(-2) != kv_heads) return expected();
    rows = dim == 3 ? buf.size(0) : buf.size(0) * buf.size(1);
    if (dim == 4 && buf.size(0) > 1 && buf.stride(0) != buf.size(1) * buf.stride(1)) {
      return fail(PyExc_ValueError, name, ": page stride ", buf.stride(0), " must be page_size * row stride = ",
                  buf.size(1), " * ", buf.stride(1), " (pages viewed as one array of slots)");
    }
    row_stride = buf.stride(dim - 3);
    head_stride = buf.stride(-2);
  } else {
    return expected();
  }
  if (buf.numel() > 0 && buf.stride(-1) != 1) {
    return fail(PyExc_ValueError, name, ": last dim must be contiguous (stride 1), got stride ", buf.stride(-1));
  }
  return std::nullopt;
}

std::optional<Failure> check_scale(const char* name, bool has, double v) {
  if (!has || (v > 0 && v != HUGE_VAL)) return std::nullopt;
  char* repr = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
  Failure f = fail(PyExc_ValueError, name, ": must be a positive finite float or None, got ",
                   repr ? repr : "?");
  PyMem_Free(repr);
  return f;
}

// Mirrors kv_store.check_kv_store_args after the rotary checks; fills `sp`.
std::optional<Failure> check_store(const StoreArgs& a, const Tensor& positions, const Tensor& key, int64_t head_size,
                                   int64_t kv_heads, KvStoreParams& sp) {
  RETURN_IF_FAILED(check_device("value", *a.value, positions));
  RETURN_IF_FAILED(check_device("k_buffer", *a.k_buffer, positions));
  RETURN_IF_FAILED(check_device("v_buffer", *a.v_buffer, positions));
  RETURN_IF_FAILED(check_device("cache_loc", *a.cache_loc, positions));
  if (a.value->scalar_type() != key.scalar_type()) {
    return fail(PyExc_TypeError, "value: dtype ", dtype_name(a.value->scalar_type()), " must equal the key's dtype ",
                dtype_name(key.scalar_type()));
  }
  Layout v{};
  RETURN_IF_FAILED(heads_layout("value", *a.value, positions, head_size, v));
  if (v.heads != kv_heads) return fail(PyExc_ValueError, "value: ", v.heads, " heads, the key has ", kv_heads);
  const auto bdtype = buffer_dtype(a.k_buffer->scalar_type());
  if (!bdtype) {
    return fail(PyExc_TypeError, "k_buffer: expected dtype float32, float16, bfloat16, float64, float8_e4m3fn or "
                "float8_e5m2, got ", dtype_name(a.k_buffer->scalar_type()));
  }
  if (a.v_buffer->scalar_type() != a.k_buffer->scalar_type()) {
    return fail(PyExc_TypeError, "v_buffer: dtype ", dtype_name(a.v_buffer->scalar_type()),
                " must equal k_buffer's dtype ", dtype_name(a.k_buffer->scalar_type()));
  }
  RETURN_IF_FAILED(buffer_layout("k_buffer", *a.k_buffer, kv_heads, head_size, sp.k_rows, sp.k_row_stride,
                                 sp.k_head_stride));
  RETURN_IF_FAILED(buffer_layout("v_buffer", *a.v_buffer, kv_heads, head_size, sp.v_rows, sp.v_row_stride,
                                 sp.v_head_stride_buf));
  const Tensor& loc = *a.cache_loc;
  if (!is_index_dtype(loc.scalar_type())) {
    return fail(PyExc_TypeError, "cache_loc: expected dtype int32 or int64, got ", dtype_name(loc.scalar_type()));
  }
  if (loc.numel() != positions.numel() || !loc.is_contiguous()) {
    return fail(PyExc_ValueError, "cache_loc: expected a contiguous tensor of ", positions.numel(),
                " elements (one buffer row per token), got shape ", shape_of(loc));
  }
  RETURN_IF_FAILED(check_scale("k_scale", a.has_k_scale, a.k_scale));
  RETURN_IF_FAILED(check_scale("v_scale", a.has_v_scale, a.v_scale));
  sp.value = a.value->const_data_ptr();
  sp.k_buffer = a.k_buffer->data_ptr();
  sp.v_buffer = a.v_buffer->data_ptr();
  sp.cache_loc = loc.const_data_ptr();
  sp.v_batch_stride = v.batch_stride;
  sp.v_token_stride = v.token_stride;
  sp.v_head_stride = v.head_stride;
  sp.head_size = static_cast<int32_t>(head_size);
  sp.k_scale = a.has_k_scale ? static_cast<float>(a.k_scale) : 1.f;
  sp.v_scale = a.has_v_scale ? static_cast<float>(a.v_scale) : 1.f;
  sp.k_inv_scale = 1.f / sp.k_scale;
  sp.v_inv_scale = 1.f / sp.v_scale;
  sp.buffer_dtype = *bdtype;
  sp.loc_int64 = loc.scalar_type() == ScalarType::Long;
  return std::nullopt;
}

// checks.GRAD_MESSAGE: the in-place ops refuse tensors they write that record gradients.
std::optional<Failure> check_no_grad(const Tensor& query, const Tensor* key, const StoreArgs* store) {
  if (!at::GradMode::is_enabled()) return std::nullopt;
  const std::pair<const char*, const Tensor*> written[] = {
      {"query", &query}, {"key", key}, {"k_buffer", store ? store->k_buffer : nullptr},
      {"v_buffer", store ? store->v_buffer : nullptr}};
  for (const auto& [name, t] : written) {
    if (t && t->requires_grad()) {
      return fail(PyExc_RuntimeError, name,
                  ": requires grad, but rope_compat's in-place ops are not differentiable; use "
                  "rope_compat.apply_rope_with_cos_sin_cache (out of place, differentiable), or call the "
                  "in-place op under torch.no_grad() or torch.inference_mode()");
    }
  }
  return std::nullopt;
}

// Checks every argument of a rotary op (and of the KV store when `store` is set) for a kernel
// that takes tensors on `device_type` (else a ValueError ending in `device_message`), then
// fills `p` (and `sp`). `p` and `sp` must come value-initialized: when there is nothing to
// rotate (no tokens or no heads) `p` is left so, with p.num_tokens == 0.
std::optional<Failure> check_rotary(const Tensor& positions, const Tensor& query, const Tensor* key,
         int64_t head_size, const Tensor& cache, bool is_neox, int64_t rope_dim_offset, bool inverse,
         const Tensor* offsets, const StoreArgs* store, c10::DeviceType device_type, const char* device_message,
         RotaryParams& p, KvStoreParams& sp) {
  if (!is_index_dtype(positions.scalar_type())) {
    return fail(PyExc_TypeError, "positions: expected dtype int32 or int64, got ", dtype_name(positions.scalar_type()));
  }
  if (positions.dim() != 1 && positions.dim() != 2) {
    return fail(PyExc_ValueError, "positions: expected shape [num_tokens] or [batch, seq_len], got ", shape_of(positions));
  }
  if (!positions.is_contiguous()) return fail(PyExc_ValueError, "positions: must be contiguous");
  const auto dtype = float_dtype(query.scalar_type(), false);
  if (!dtype) {
    return fail(PyExc_TypeError, "query: expected dtype float32, float16 or bfloat16, got ", dtype_name(query.scalar_type()));
  }
  if (key && key->scalar_type() != query.scalar_type()) {
    return fail(PyExc_TypeError, "key: dtype ", dtype_name(key->scalar_type()), " must equal query's dtype ",
         dtype_name(query.scalar_type()));
  }
  const auto cache_dtype = float_dtype(cache.scalar_type(), true);
  if (!cache_dtype) {
    return fail(PyExc_TypeError, "cos_sin_cache: expected a float dtype (float32, float16, bfloat16, float64), got ",
         dtype_name(cache.scalar_type()));
  }
  RETURN_IF_FAILED(check_device("query", query, positions));
  RETURN_IF_FAILED(check_device("cos_sin_cache", cache, positions));
  if (key) RETURN_IF_FAILED(check_device("key", *key, positions));
  if (offsets) RETURN_IF_FAILED(check_device("cos_sin_cache_offsets", *offsets, positions));
  // The public entry point and the dispatcher only send this kernel's tensors here; a direct
  // call of launch() with another device's tensors must not hand their pointers to the kernel.
  if (positions.device().type() != device_type) {
    return fail(PyExc_ValueError, "positions: on device ", positions.device().str(), "; ", device_message);
  }
  if (head_size <= 0) return fail(PyExc_ValueError, "head_size: must be positive, got ", head_size);
  if (cache.dim() != 2) {
    return fail(PyExc_ValueError, "cos_sin_cache: expected 2 dims [max_position, rot_dim], got shape ", shape_of(cache));
  }
  const int64_t rot_dim = cache.size(1);
  if (rot_dim <= 0 || rot_dim % 2 != 0) {
    return fail(PyExc_ValueError, "cos_sin_cache: rot_dim (size of dim 1) must be even and positive, got ", rot_dim);
  }
  if (cache.numel() > 0 && cache.stride(1) != 1) {
    return fail(PyExc_ValueError, "cos_sin_cache: last dim must be contiguous (stride 1)");
  }
  if (rope_dim_offset < 0) return fail(PyExc_ValueError, "rope_dim_offset: must be >= 0, got ", rope_dim_offset);
  if (rope_dim_offset + rot_dim > head_size) {
    return fail(PyExc_ValueError, "rope_dim_offset + rot_dim = ", rope_dim_offset, " + ", rot_dim,
         " exceeds head_size=", head_size);
  }
  Layout q{}, k{};
  RETURN_IF_FAILED(heads_layout("query", query, positions, head_size, q));
  if (key) {
    RETURN_IF_FAILED(heads_layout("key", *key, positions, head_size, k));
    if (k.heads == 0 || q.heads % k.heads != 0) {
      return fail(PyExc_ValueError, "key: query heads (", q.heads, ") must be a multiple of key heads (", k.heads, ")");
    }
  }
  const int64_t num_tokens = positions.numel();
  if (offsets) {
    if (!is_index_dtype(offsets->scalar_type())) {
      return fail(PyExc_TypeError, "cos_sin_cache_offsets: expected dtype int32 or int64, got ",
           dtype_name(offsets->scalar_type()));
    }
    if (offsets->numel() != num_tokens || !offsets->is_contiguous()) {
      return fail(PyExc_ValueError, "cos_sin_cache_offsets: expected a contiguous tensor of ", num_tokens,
           " elements (one per token), got shape ", shape_of(*offsets));
    }
  }
  if (store) RETURN_IF_FAILED(check_store(*store, positions, *key, head_size, k.heads, sp));
  RETURN_IF_FAILED(check_no_grad(query, key, store));
  if (num_tokens > INT32_MAX || q.heads + k.heads > INT32_MAX) {
    return fail(PyExc_ValueError, "positions: at most 2**31 - 1 tokens are supported, got ", num_tokens);
  }
  if (num_tokens == 0 || q.heads + k.heads == 0) return std::nullopt;

  p.positions = positions.const_data_ptr();
  p.cache_offsets = offsets ? offsets->const_data_ptr() : nullptr;
  p.query = query.data_ptr();
  p.key = key && k.heads > 0 ? key->data_ptr() : nullptr;
  p.cache = cache.const_data_ptr();
  p.q_batch_stride = q.batch_stride;
  p.q_token_stride = q.token_stride;
  p.q_head_stride = q.head_stride;
  p.k_batch_stride = k.batch_stride;
  p.k_token_stride = k.token_stride;
  p.k_head_stride = k.head_stride;
  p.cache_rows = cache.size(0);
  p.cache_row_stride = cache.stride(0);
  p.num_tokens = static_cast<int32_t>(num_tokens);
  p.seq_len = static_cast<int32_t>(positions.dim() == 2 ? positions.size(1) : num_tokens);
  p.num_heads = static_cast<int32_t>(q.heads);
  p.num_kv_heads = static_cast<int32_t>(k.heads);
  p.rot_dim = static_cast<int32_t>(rot_dim);
  p.rope_dim_offset = static_cast<int32_t>(rope_dim_offset);
  p.dtype = *dtype;
  p.cache_dtype = *cache_dtype;
  p.positions_int64 = positions.scalar_type() == ScalarType::Long;
  p.offsets_int64 = offsets && offsets->scalar_type() == ScalarType::Long;
  p.is_neox = is_neox;
  p.inverse = inverse;
  return std::nullopt;
}

}  // namespace
}  // namespace rope_compat
