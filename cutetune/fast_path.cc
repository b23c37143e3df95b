// The ops' fast path (cutetune/fast_path.py builds and loads this file): one route per kernel,
// a TVM-FFI function the op calls with its arguments. It reads the key its kernel's FastCall
// declares (dtypes, dims and scalar values of the arguments, and the device) straight from the
// converted arguments, finds the row of compiled kernels the op's checked path remembered under
// that key (what the dispatcher serves), picks the token bucket, checks what the launcher does
// not (row overlap, non-empty dims, rows that grow with the tokens) and calls the kernel with the
// leading arguments. It returns false, having launched nothing, wherever the op's checked path
// must take the call.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ffi = tvm::ffi;

namespace {

// The reading kinds, as cutetune/fast_path.py encodes them.
constexpr int64_t kDtype = 0, kDim = 1, kValue = 2;
constexpr int kMaxKey = 40;  // words; cutetune/fast_path.py checks each route's key fits

struct Key {
  int32_t size = 0;
  int64_t words[kMaxKey];
  bool operator==(const Key& other) const {
    return size == other.size && std::memcmp(words, other.words, size * sizeof(int64_t)) == 0;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < key.size; ++i) h = (h ^ static_cast<uint64_t>(key.words[i])) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Row {
  std::vector<ffi::Optional<ffi::Function>> kernels;  // by token bucket; none: the checked path
  int64_t rows_per_token = 0, rows_extra = 0;          // the rows argument's least rows
};

struct Reading {
  int64_t kind, argument, dim;
};

struct Route {
  int64_t arguments = 0, launched = 0, tokens_argument = 0, tokens_dim = 0;
  int64_t rows_argument = -1;  // -1: none
  std::vector<Reading> readings;
  std::vector<int64_t> disjoint_rows;
  std::vector<std::pair<int64_t, int64_t>> nonempty;
  std::shared_mutex mutex;
  std::unordered_map<Key, Row, KeyHash> rows;
  std::unordered_map<std::string, int64_t> strings;  // interned string values, by content
};

const DLTensor* TensorAt(const TVMFFIAny* arguments, int64_t i) {
  const TVMFFIAny& a = arguments[i];
  if (a.type_index == ffi::TypeIndex::kTVMFFITensor) return TVMFFITensorGetDLTensorPtr(a.v_obj);
  if (a.type_index == ffi::TypeIndex::kTVMFFIDLTensorPtr) return static_cast<DLTensor*>(a.v_ptr);
  return nullptr;
}

int64_t RowStride(const DLTensor* t) {
  return t->strides != nullptr ? t->strides[0] : (t->ndim > 1 ? t->shape[1] : 1);
}

// The key of a call, the device of its first tensor first; false where an argument does not
// have what a reading reads (the checked path then names the fault). `intern` adds unseen
// string values (remembering); without it an unseen string is no key (routing).
bool KeyOf(Route& route, const TVMFFIAny* arguments, bool intern, Key* key) {
  const DLTensor* first = TensorAt(arguments, 0);
  if (first == nullptr) return false;
  key->size = 0;
  key->words[key->size++] = (static_cast<int64_t>(first->device.device_type) << 32) |
                            static_cast<uint32_t>(first->device.device_id);
  for (const Reading& r : route.readings) {
    if (key->size + 2 > kMaxKey) return false;
    if (r.kind == kValue) {
      const TVMFFIAny& a = arguments[r.argument];
      int64_t payload;
      switch (a.type_index) {
        case ffi::TypeIndex::kTVMFFINone: payload = 0; break;
        case ffi::TypeIndex::kTVMFFIInt:
        case ffi::TypeIndex::kTVMFFIBool:
        case ffi::TypeIndex::kTVMFFIFloat: payload = a.v_int64; break;
        case ffi::TypeIndex::kTVMFFIDataType:
          payload = (static_cast<int64_t>(a.v_dtype.code) << 32) |
                    (static_cast<int64_t>(a.v_dtype.bits) << 16) | a.v_dtype.lanes;
          break;
        case ffi::TypeIndex::kTVMFFISmallStr:
        case ffi::TypeIndex::kTVMFFIStr: {
          std::string text(
              ffi::AnyView::CopyFromTVMFFIAny(a).cast<ffi::String>().operator std::string());
          auto found = route.strings.find(text);
          if (found == route.strings.end()) {
            if (!intern) return false;
            found = route.strings.emplace(text, static_cast<int64_t>(route.strings.size())).first;
          }
          payload = found->second;
          break;
        }
        default: return false;
      }
      key->words[key->size++] = a.type_index == ffi::TypeIndex::kTVMFFISmallStr
                                    ? ffi::TypeIndex::kTVMFFIStr : a.type_index;
      key->words[key->size++] = payload;
      continue;
    }
    const DLTensor* t = TensorAt(arguments, r.argument);
    if (t == nullptr) return false;
    if (r.kind == kDtype) {
      key->words[key->size++] = (static_cast<int64_t>(t->dtype.code) << 32) |
                                (static_cast<int64_t>(t->dtype.bits) << 16) | t->dtype.lanes;
    } else {
      if (r.dim >= t->ndim) return false;
      key->words[key->size++] = t->shape[r.dim];
    }
  }
  return true;
}

void CheckArity(const Route& route, int32_t given, int32_t expected) {
  if (given != expected) {
    TVM_FFI_THROW(InternalError) << "cutetune fast path: " << given << " arguments, expected "
                                 << expected;
  }
}

// The route: true where it launched the kernel.
bool RouteCall(Route& route, ffi::PackedArgs arguments) {
  CheckArity(route, arguments.size(), static_cast<int32_t>(route.arguments));
  const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(arguments.data());
  const DLTensor* tokens_tensor = TensorAt(raw, route.tokens_argument);
  if (tokens_tensor == nullptr || route.tokens_dim >= tokens_tensor->ndim) return false;
  const int64_t tokens = tokens_tensor->shape[route.tokens_dim];
  if (tokens < 1) return false;
  ffi::Function kernel;
  {
    std::shared_lock<std::shared_mutex> lock(route.mutex);
    Key key;
    if (!KeyOf(route, raw, false, &key)) return false;
    auto found = route.rows.find(key);
    if (found == route.rows.end()) return false;
    const Row& row = found->second;
    // Bucket b serves (2^(b-1), 2^b] tokens.
    const uint64_t below = static_cast<uint64_t>(tokens - 1);
    const size_t bucket = below == 0 ? 0 : 64 - __builtin_clzll(below);
    if (bucket >= row.kernels.size() || !row.kernels[bucket].has_value()) return false;
    if (route.rows_argument >= 0) {
      const DLTensor* t = TensorAt(raw, route.rows_argument);
      if (t == nullptr || t->ndim < 1 ||
          t->shape[0] < tokens * row.rows_per_token + row.rows_extra) {
        return false;
      }
    }
    kernel = *row.kernels[bucket];
  }
  for (int64_t i : route.disjoint_rows) {
    const DLTensor* t = TensorAt(raw, i);
    if (t == nullptr || t->ndim != 2) return false;
    if (t->shape[0] > 1 && RowStride(t) < t->shape[1]) return false;
  }
  for (const auto& [i, dim] : route.nonempty) {
    const DLTensor* t = TensorAt(raw, i);
    if (t == nullptr || dim >= t->ndim || t->shape[dim] == 0) return false;
  }
  ffi::Any ignored;
  kernel.CallPacked(arguments.data(), static_cast<int32_t>(route.launched), &ignored);
  return true;
}

// Remember: the route's arguments, then the row (its kernels by bucket, and the rows
// argument's rows per token and extra rows).
void Remember(Route& route, ffi::PackedArgs arguments) {
  CheckArity(route, arguments.size(), static_cast<int32_t>(route.arguments) + 3);
  const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(arguments.data());
  Row row;
  for (const ffi::Any& kernel : arguments[route.arguments].cast<ffi::Array<ffi::Any>>()) {
    row.kernels.push_back(kernel.cast<ffi::Optional<ffi::Function>>());
  }
  row.rows_per_token = arguments[route.arguments + 1].cast<int64_t>();
  row.rows_extra = arguments[route.arguments + 2].cast<int64_t>();
  std::unique_lock<std::shared_mutex> lock(route.mutex);
  Key key;
  if (!KeyOf(route, raw, true, &key)) {
    TVM_FFI_THROW(ValueError) << "cutetune fast path: the arguments do not have what the "
                                 "route's key reads";
  }
  route.rows[key] = std::move(row);
}

std::vector<int64_t> Ints(const ffi::Array<int64_t>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

// A route for `arguments` arguments of which the first `launched` go to the kernel;
// `readings` flat (kind, argument, dim) triples; `nonempty` flat (argument, dim) pairs.
// Returns [route, remember, forget].
ffi::Array<ffi::Function> MakeRoute(int64_t arguments, int64_t launched, int64_t tokens_argument,
                                    int64_t tokens_dim, ffi::Array<int64_t> readings,
                                    ffi::Array<int64_t> disjoint_rows,
                                    ffi::Array<int64_t> nonempty, int64_t rows_argument) {
  auto route = std::make_shared<Route>();
  route->arguments = arguments;
  route->launched = launched;
  route->tokens_argument = tokens_argument;
  route->tokens_dim = tokens_dim;
  route->rows_argument = rows_argument;
  std::vector<int64_t> flat = Ints(readings);
  for (size_t i = 0; i + 2 < flat.size(); i += 3) {
    route->readings.push_back({flat[i], flat[i + 1], flat[i + 2]});
  }
  route->disjoint_rows = Ints(disjoint_rows);
  std::vector<int64_t> pairs = Ints(nonempty);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) route->nonempty.emplace_back(pairs[i], pairs[i + 1]);
  return ffi::Array<ffi::Function>{
      ffi::Function::FromPacked([route](ffi::PackedArgs a, ffi::Any* rv) {
        *rv = RouteCall(*route, a);
      }),
      ffi::Function::FromPacked([route](ffi::PackedArgs a, ffi::Any* rv) { Remember(*route, a); }),
      ffi::Function::FromPacked([route](ffi::PackedArgs, ffi::Any*) {
        std::unique_lock<std::shared_mutex> lock(route->mutex);
        route->rows.clear();
      }),
  };
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_route, MakeRoute);

// A kernel's stand-in that takes any arguments and does nothing: what the benchmarks time a
// route's own cost with.
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_do_nothing(void*, const TVMFFIAny*, int32_t,
                                                       TVMFFIAny* result) {
  result->type_index = ffi::TypeIndex::kTVMFFINone;
  return 0;
}
