// The "tpu" device's C++ shim: PyTorch's PrivateUse1 key, renamed "tpu" by the Python side.
//
// It only adapts PyTorch's C++ interfaces to the Rust runtime behind `TpukDeviceApi`
// (tpuk_device.h): the allocator, the device guard and hooks, the kernels every backend needs
// (empty, views, copies, resize), the kernels that forward bound ATen overloads to the Rust
// dispatcher, and the fallback that runs every other op on CPU kernels over an alias of the same
// memory (no copy). What runs where, what is counted and every error's text are decided in Rust.
//
// On the embedded default a "tpu" tensor's memory is host memory from the Rust caching
// allocator, which the PJRT CPU client reads in place; kernel outputs are PJRT buffers whose
// host memory becomes the output tensor's storage (no copy).

#include "tpuk_device.h"

#include <array>
#include <atomic>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_grouped_mm_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <dlfcn.h>
#include <pthread.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

const TpukDeviceApi* g_api = nullptr;

// The numbering both sides use for element types is c10's.
static_assert(static_cast<int>(c10::ScalarType::Byte) == 0);
static_assert(static_cast<int>(c10::ScalarType::Char) == 1);
static_assert(static_cast<int>(c10::ScalarType::Short) == 2);
static_assert(static_cast<int>(c10::ScalarType::Int) == 3);
static_assert(static_cast<int>(c10::ScalarType::Long) == 4);
static_assert(static_cast<int>(c10::ScalarType::Half) == 5);
static_assert(static_cast<int>(c10::ScalarType::Float) == 6);
static_assert(static_cast<int>(c10::ScalarType::Double) == 7);
static_assert(static_cast<int>(c10::ScalarType::Bool) == 11);
static_assert(static_cast<int>(c10::ScalarType::BFloat16) == 15);
static_assert(static_cast<int>(c10::ScalarType::Float8_e5m2) == 23);
static_assert(static_cast<int>(c10::ScalarType::Float8_e4m3fn) == 24);
static_assert(static_cast<int>(c10::ScalarType::UInt16) == 27);
static_assert(static_cast<int>(c10::ScalarType::UInt32) == 28);
static_assert(static_cast<int>(c10::ScalarType::UInt64) == 29);

c10::Device tpu_device() { return c10::Device(c10::DeviceType::PrivateUse1, 0); }

std::string last_message() {
  char buf[1024];
  size_t n = g_api->message(buf, sizeof buf);
  if (n <= sizeof buf) {
    return std::string(buf, n);
  }
  std::string s(n, '\0');
  g_api->message(s.data(), n);
  return s;
}

void check_installed() {
  TORCH_CHECK(g_api != nullptr,
              "the tpu device's runtime is not installed: import tpu_kernels.device first");
}

void check_index(c10::Device d) {
  TORCH_CHECK(d.type() == c10::DeviceType::PrivateUse1, "not a tpu device: ", d);
  TORCH_CHECK(!d.has_index() || d.index() == 0, "tpu:", static_cast<int>(d.index()),
              " does not exist: this process has one tpu device, tpu:0");
}

// ----- memory -----

void noop_delete(void*) {}

struct TpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    check_installed();
    if (nbytes == 0) {
      return {nullptr, nullptr, &noop_delete, tpu_device()};
    }
    void* ctx = nullptr;
    void* data = g_api->alloc(nbytes, &ctx);
    if (data == nullptr) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, last_message());
    }
    return {data, ctx, g_api->free, tpu_device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }
};

TpuAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

constexpr c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

// A tensor of `dtype` with `sizes`, `strides` and `offset` over `storage`, on the tpu device.
at::Tensor tpu_tensor_over(c10::Storage storage, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                           c10::IntArrayRef strides, int64_t offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), kTpuKeys, dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

void drop_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// A tpu storage's reference to CPU memory: dropped once no pending recorded trace may read it.
void retire_storage_ref(void* ctx) { g_api->retire(ctx, &drop_storage_ref); }

// A storage on `device` over the memory of `storage`, which it keeps alive.
c10::Storage storage_alias(const c10::Storage& storage, c10::Device device, bool resizable,
                           c10::Allocator* allocator) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(impl);
  bool on_tpu = device.type() == c10::DeviceType::PrivateUse1;
  c10::DataPtr dp(const_cast<void*>(storage.data()), impl,
                  on_tpu ? &retire_storage_ref : &drop_storage_ref, device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(dp), allocator, resizable));
}

// A CPU tensor over the same memory as tpu tensor `t` (same sizes, strides, offset, dtype). Its
// storage is resizable: a CPU kernel that grows an out= argument reallocates the alias, and the
// fallback copies the result back (see `write_back`).
at::Tensor cpu_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  c10::Storage storage = storage_alias(t.storage(), c10::Device(c10::kCPU), true,
                                       c10::GetCPUAllocator());
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

// A block the device adopted from the CPU allocator (a fallback's fresh result).
struct Adopted {
  c10::DataPtr block;
  size_t bytes;
};

void drop_adopted_now(void* ctx) {
  auto* adopted = static_cast<Adopted*>(ctx);
  g_api->adopted(-static_cast<ptrdiff_t>(adopted->bytes));
  delete adopted;  // frees the block through its own deleter
}

// Freed once no pending recorded trace may read it.
void drop_adopted(void* ctx) { g_api->retire(ctx, &drop_adopted_now); }

// A tpu tensor over the memory of CPU tensor `r` (a fallback's fresh result), with no copy.
at::Tensor tpu_retag(const at::Tensor& r) {
  const c10::Storage& s = r.storage();
  c10::Storage storage;
  // Held by `r` alone (the reclaimed pointer below adds one strong reference), no weak ones.
  auto held = c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(
      s.unsafeGetStorageImpl());
  bool sole = held.use_count() == 2 && held.weak_use_count() == 1;
  held.reset();
  if (sole) {
    // Only `r` holds the memory: the device adopts the CPU allocator's block (counted as
    // device memory until the storage dies).
    auto* adopted = new Adopted{s.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr()), s.nbytes()};
    void* data = adopted->block.get();
    g_api->adopted(static_cast<ptrdiff_t>(adopted->bytes));
    c10::DataPtr dp(data, adopted, &drop_adopted, tpu_device());
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), s.nbytes(), std::move(dp), &g_allocator, true));
  } else {
    storage = storage_alias(s, tpu_device(), false, nullptr);
  }
  return tpu_tensor_over(std::move(storage), r.dtype(), r.sizes(), r.strides(),
                         r.storage_offset());
}

// ----- device guard, hooks, generator -----

// PyTorch's autograd engine runs a device's backward on a thread of its own
// (`pt_autograd_<index>`), which lives as long as the process. CPU kernels there (the fallback,
// copies) would start a second OpenMP team beside the main thread's; libgomp then manages more
// threads than there are CPUs and throttles every team's spinning, so from then on each
// parallel region in the process waits for its workers to wake (a parallel relu over 65536
// floats on the main thread: 6 us before, 80-120 us after, docs/perf-log.md). The engine's
// threads run their CPU kernels on themselves alone; the main thread keeps its team.
void serial_on_engine_thread() noexcept {
  thread_local bool done = false;
  if (done) return;
  done = true;
  char name[16] = {0};
  if (pthread_getname_np(pthread_self(), name, sizeof name) != 0 ||
      std::strncmp(name, "pt_autograd_", 12) != 0) {
    return;
  }
  // ATen sets a thread's OpenMP thread count lazily, at its first parallel region: done first,
  // so that it does not undo what follows.
  (void)at::get_num_threads();
  if (void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    if (auto set = reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads"))) set(1);
    dlclose(gomp);
  }
  // MKL keeps its own per-thread count (torch's BLAS calls). `MKL_Set_Num_Threads_Local` is
  // its C entry; the lowercase symbol is the Fortran one, which takes a pointer.
  if (auto set = reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"))) {
    set(1);
  }
}

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_index(d);
    return tpu_device();
  }
  c10::Device getDevice() const override { return tpu_device(); }
  // The autograd engine's device thread calls this first (see `serial_on_engine_thread`).
  void setDevice(c10::Device d) const override {
    check_index(d);
    serial_on_engine_thread();
  }
  void uncheckedSetDevice(c10::Device) const noexcept override { serial_on_engine_thread(); }
  c10::Stream getStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, tpu_device());
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, tpu_device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // The device has no native stream object (DLPack's exchange asks for one).
  void* getStreamNativeHandle(const c10::Stream) const override { return nullptr; }
  // Every op has finished when it returns (kernels are waited for before their outputs become
  // tensors), so events and streams have nothing to wait for.
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuard);

// Random ops on the device run CPU kernels; they draw from this generator, seeded by
// `torch.tpu.manual_seed` (and `torch.manual_seed`), so a seed gives the same numbers as on CPU.
at::Generator& tpu_generator() {
  static at::Generator gen = at::detail::createCPUGenerator();
  return gen;
}

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return tpu_generator();
  }
  at::Device getDeviceFromPtr(void*) const override { return tpu_device(); }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ----- the native recorder's materialisation points -----

// Runs what the native recorder holds before a call reads or writes device memory directly.
void materialise(const std::string& reason) {
  if (g_api == nullptr || g_api->mode() != TPUK_MODE_RECORD) return;
  TORCH_CHECK(g_api->flush(reason.data(), reason.size()) == TPUK_RAN, last_message());
}

// Whether the `nargs` arguments from `first` on hold device memory: a device tensor (alone or
// in a list) with elements. A call that holds none reads and writes no pending value (an empty
// KV cache's `cat` entries, `zero_` of an empty tensor), so it needs no flush.
bool holds_device_memory(const torch::jit::Stack& stack, size_t first, size_t nargs) {
  auto holds = [](const at::Tensor& t) {
    return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.numel() > 0;
  };
  for (size_t i = first; i < first + nargs; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && holds(v.toTensor())) return true;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (holds(t)) return true;
      }
    }
    if (v.isOptionalTensorList()) {
      for (const auto& t : v.toOptionalTensorList().vec()) {
        if (t.has_value() && holds(*t)) return true;
      }
    }
  }
  return false;
}

// ----- the kernels every backend needs -----

at::Tensor tpu_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                     std::optional<c10::Layout>, std::optional<c10::Device> device,
                     std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  if (device) check_index(*device);
  return at::detail::empty_generic(size, &g_allocator, kTpuKeys, c10::dtype_or_default(dtype),
                                   memory_format);
}

at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                             std::optional<c10::Device> device, std::optional<bool>) {
  if (device) check_index(*device);
  return at::detail::empty_strided_generic(size, stride, &g_allocator, kTpuKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor host_view(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::PrivateUse1 ? cpu_alias(t) : t;
}

bool record_call(const c10::OperatorHandle* target, torch::jit::Stack* stack, size_t first,
                 size_t nargs, std::vector<at::Tensor> written);

// A copy between tpu tensors in fused mode with the native recorder: recorded as `aten::copy`
// into `dst` when the recorder takes it.
bool record_copy(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (g_api == nullptr || g_api->mode() != TPUK_MODE_RECORD) return false;
  if (self.device().type() != c10::DeviceType::PrivateUse1 ||
      dst.device().type() != c10::DeviceType::PrivateUse1) {
    return false;
  }
  static const c10::OperatorHandle copy =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy", "");
  torch::jit::Stack stack{dst, self, non_blocking};
  return record_call(&copy, &stack, 0, 3, {dst});
}

at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (record_copy(self, dst, non_blocking)) return dst;
  if (self.numel() == 0 && dst.numel() == 0) return dst;
  materialise("copy");
  host_view(dst).copy_(host_view(self), non_blocking);
  return dst;
}

at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  materialise("copy");
  dst.resize_(self.sizes());
  host_view(dst).copy_(host_view(self));
  return dst;
}

TpukArg tensor_arg(const at::Tensor& t);

at::Scalar tpu_local_scalar_dense(const at::Tensor& self) {
  if (g_api != nullptr && g_api->mode() == TPUK_MODE_RECORD && self.numel() == 1) {
    // A value the pending trace can give exactly, without running it.
    at::Tensor host = at::empty({}, self.options().device(at::kCPU));
    const TpukArg arg = tensor_arg(self);
    const int32_t rc =
        g_api->scalar(&arg, static_cast<uint8_t*>(host.data_ptr()), host.nbytes());
    TORCH_CHECK(rc != TPUK_ERROR, last_message());
    if (rc == TPUK_RAN) return at::native::_local_scalar_dense_cpu(host);
  }
  materialise("item");
  return at::native::_local_scalar_dense_cpu(cpu_alias(self));
}

const at::Tensor& tpu_resize(const at::Tensor& self, c10::IntArrayRef size,
                            std::optional<c10::MemoryFormat> memory_format) {
  // Only a resize that moves bytes into new memory reads device memory, but one of an empty
  // storage (an out= tensor PyTorch made empty) is followed by an eager write into memory the
  // pending trace may have given back: the trace runs first, so that a replay of it, which
  // writes where its values lived, cannot meet that write.
  const size_t have = self.storage().nbytes();
  const size_t need = at::detail::computeStorageNbytesContiguous(
      size, self.dtype().itemsize(), self.storage_offset());
  if (have == 0 || need > have) materialise("resize_");
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& tpu_set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
  return at::native::set_storage_cpu_(self, std::move(empty), 0, {0}, {});
}

// `ns::op.overload` (`.default` for the default overload), as report() keys ops.
std::string op_key(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.name + "." + (name.overload_name.empty() ? "default" : name.overload_name);
}

// ----- arguments as the Rust side reads them -----

// Storage for the list arguments `marshal` hands over (alive for the call).
struct Scratch {
  std::vector<std::vector<int64_t>> ints;
  std::vector<std::vector<uint8_t>> bools;
  std::vector<std::vector<TpukArg>> lists;
};

TpukArg tensor_arg(const at::Tensor& t) {
  TpukArg a;
  std::memset(&a, 0, sizeof a);
  if (!t.defined()) return a;
  a.kind = TPUK_TENSOR;
  a.dtype = static_cast<int32_t>(t.scalar_type());
  a.device = t.device().type() == c10::DeviceType::PrivateUse1 ? TPUK_ON_TPU
             : t.device().is_cpu()                             ? TPUK_ON_CPU
                                                               : TPUK_ON_OTHER;
  a.len = static_cast<int32_t>(t.dim());
  a.data = (t.numel() == 0 || a.device == TPUK_ON_OTHER) ? nullptr : t.const_data_ptr();
  a.sizes = t.sizes().data();
  a.strides = t.strides().data();
  return a;
}

// Inline room for a call's arguments and results: most calls allocate none.
using Args = c10::SmallVector<TpukArg, 8>;
using Outs = c10::SmallVector<TpukOut, 2>;
using Results = c10::SmallVector<at::Tensor, 2>;

// The `nargs` arguments from `first` on, one `TpukArg` each, into `args`.
void marshal(const torch::jit::Stack& stack, size_t first, size_t nargs, Scratch& scratch,
             Args& args) {
  args.resize(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = stack[first + i];
    TpukArg& a = args[i];
    std::memset(&a, 0, sizeof a);
    if (v.isTensor()) {
      a = tensor_arg(v.toTensor());
    } else if (v.isNone()) {
      a.kind = TPUK_NONE;
    } else if (v.isBool()) {
      a.kind = TPUK_BOOL;
      a.i = v.toBool();
    } else if (v.isInt()) {
      a.kind = TPUK_INT;
      a.i = v.toInt();
    } else if (v.isDouble()) {
      a.kind = TPUK_DOUBLE;
      a.d = v.toDouble();
    } else if (v.isString()) {
      a.kind = TPUK_STRING;
      a.data = v.toStringRef().data();
      a.i = static_cast<int64_t>(v.toStringRef().size());
    } else if (v.isIntList()) {
      scratch.ints.push_back(v.toIntVector());
      a.kind = TPUK_INT_LIST;
      a.data = scratch.ints.back().data();
      a.len = static_cast<int32_t>(scratch.ints.back().size());
    } else if (v.isBoolList()) {
      std::vector<uint8_t> b;
      for (bool x : v.toBoolList()) b.push_back(x ? 1 : 0);
      scratch.bools.push_back(std::move(b));
      a.kind = TPUK_BOOL_LIST;
      a.data = scratch.bools.back().data();
      a.len = static_cast<int32_t>(scratch.bools.back().size());
    } else {
      a.kind = TPUK_OTHER;
    }
  }
}

// Every tensor in `v` (a tensor, a tensor list, an optional tensor list; TPUK_NONE for an
// undefined one), and a float as TPUK_DOUBLE, appended to `out`; `keep` holds the tensors.
void flatten(const c10::IValue& v, std::vector<TpukArg>& out, std::vector<at::Tensor>& keep) {
  auto add = [&](const at::Tensor& t) {
    keep.push_back(t);
    out.push_back(tensor_arg(t));
  };
  if (v.isTensor()) {
    add(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) add(t);
  } else if (v.isOptionalTensorList()) {
    for (const auto& t : v.toOptionalTensorList().vec()) add(t.has_value() ? *t : at::Tensor());
  } else if (v.isDouble()) {
    TpukArg a;
    std::memset(&a, 0, sizeof a);
    a.kind = TPUK_DOUBLE;
    a.d = v.toDouble();
    out.push_back(a);
  }
}

// ----- debug mode -----

struct DebugState {
  bool on = false;
  bool inputs_finite = true;
  bool has_expected = false;
  // The meta function's outputs, flattened.
  std::vector<at::Tensor> expected;
};

// A meta tensor of `t`'s metadata. A wrapped number on the CPU (a Python scalar PyTorch made a
// 0-dim tensor) is passed as it is: meta functions take CPU scalars, and type promotion then
// lets it take the other operand's dtype (`loss + 1e-6` is float32; as a float64 meta tensor
// it made the result float64). A meta tensor cannot be one: Python meta functions turn wrapped
// numbers back into Python numbers, which only CPU tensors allow.
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (t.unsafeGetTensorImpl()->is_wrapped_number() && t.device().is_cpu()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

// The outputs of `op`'s meta function on the call's arguments (flattened into `expected`);
// false when it has none (or it rejects what the CPU kernel takes).
bool meta_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                  size_t nargs, std::vector<at::Tensor>& expected) {
  try {
    torch::jit::Stack meta;
    for (size_t i = 0; i < nargs; ++i) {
      const c10::IValue& v = stack[first + i];
      if (v.isTensor()) {
        meta.push_back(to_meta(v.toTensor()));
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(to_meta(t));
        meta.push_back(list);
      } else if (v.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> list;
        for (const auto& t : v.toOptionalTensorList().vec()) {
          list.push_back(t.has_value() ? std::optional<at::Tensor>(to_meta(*t)) : std::nullopt);
        }
        meta.push_back(list);
      } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
        meta.push_back(c10::Device(c10::kMeta));
      } else {
        meta.push_back(v);
      }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    for (const c10::IValue& r : meta) {
      if (r.isTensor()) {
        expected.push_back(r.toTensor());
      } else if (r.isTensorList()) {
        for (const at::Tensor& t : r.toTensorList().vec()) expected.push_back(t);
      } else if (r.isNone()) {
        expected.push_back(at::Tensor());
      }
    }
    return true;
  } catch (const std::exception&) {
    // No meta function for this op (or it rejects what the CPU kernel takes): no shape check.
    return false;
  }
}

// Before the op runs: whether its inputs are finite (in-place ops overwrite them), and its
// outputs by its meta function (none when it has no meta kernel).
DebugState debug_before(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                        size_t first, size_t nargs) {
  DebugState state;
  state.on = true;
  std::vector<TpukArg> flat;
  std::vector<at::Tensor> keep;
  const auto& schema_args = op.schema().arguments();
  for (size_t i = 0; i < nargs; ++i) {
    // An out= argument is no input: its memory is whatever the allocator handed out.
    if (i < schema_args.size() && schema_args[i].is_out()) continue;
    flatten(stack[first + i], flat, keep);
  }
  state.inputs_finite = g_api->finite(flat.data(), flat.size()) != 0;
  state.has_expected = meta_outputs(op, stack, first, nargs, state.expected);
  return state;
}

// After the op ran: its outputs (the last `nret` stack entries) checked by the Rust side.
void debug_after(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t nret,
                 const DebugState& state, bool kernel) {
  std::vector<TpukArg> outs;
  std::vector<at::Tensor> keep;
  for (size_t i = stack.size() - nret; i < stack.size(); ++i) {
    const c10::IValue& r = stack[i];
    if (r.isNone()) {
      keep.emplace_back();
      outs.push_back(tensor_arg(at::Tensor()));
    } else {
      flatten(r, outs, keep);
    }
  }
  std::vector<TpukArg> expected;
  for (const at::Tensor& t : state.expected) expected.push_back(tensor_arg(t));
  std::string full = op_key(op);
  int32_t r = g_api->check(full.data(), full.size(), kernel ? 1 : 0, state.inputs_finite ? 1 : 0,
                           outs.data(), outs.size(), expected.data(),
                           state.has_expected ? static_cast<ptrdiff_t>(expected.size()) : -1);
  TORCH_CHECK(r == TPUK_RAN, last_message());
}

// ----- the fallback -----

// Ops whose CPU index tensors may meet tpu tensors (as CUDA allows CPU indices).
bool takes_cpu_indices(const c10::OperatorName& name) {
  return name.name == "aten::index" || name.name == "aten::index_put_" ||
         name.name == "aten::index_put" || name.name == "aten::_index_put_impl_";
}

// PyTorch's rule for mixed devices: a CPU tensor with dimensions beside a tpu tensor is an error
// naming the op and the argument (0-dim CPU tensors are scalars and may come along).
void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const auto& args = op.schema().arguments();
  const at::Tensor* on_tpu = nullptr;
  const at::Tensor* on_cpu = nullptr;
  size_t cpu_arg = 0;
  auto look = [&](const at::Tensor& t, size_t i) {
    if (!t.defined()) return;
    if (t.device().type() == c10::DeviceType::PrivateUse1) {
      on_tpu = &t;
    } else if (t.device().is_cpu() && t.dim() > 0 && on_cpu == nullptr) {
      on_cpu = &t;
      cpu_arg = i;
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      look(v.toTensor(), i);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) look(t, i);
    }
  }
  if (on_tpu != nullptr && on_cpu != nullptr && !takes_cpu_indices(op.operator_name())) {
    TORCH_CHECK(false,
                "Expected all tensors to be on the same device, but found at least two devices, "
                "tpu:0 and cpu! (when checking argument `",
                args[cpu_arg].name(), "` of ", op.operator_name(), ")");
  }
}

// After a CPU kernel ran on `alias` (the CPU view of tpu tensor `t`): an out= argument the
// kernel resized or restrided gets that shape, and its data when the kernel reallocated it.
void write_back(const at::Tensor& t, const at::Tensor& alias, const void* data_before) {
  if (alias.sizes() == t.sizes() && alias.strides() == t.strides() &&
      alias.storage_offset() == t.storage_offset() && alias.storage().data() == data_before) {
    return;
  }
  if (alias.storage().data() != data_before) {
    t.resize_(alias.sizes());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(alias.sizes(), alias.strides(),
                                                   t.storage_offset());
    cpu_alias(t).copy_(alias);
    return;
  }
  t.unsafeGetTensorImpl()->set_sizes_and_strides(alias.sizes(), alias.strides(),
                                                 alias.storage_offset());
}

struct Aliased {
  at::Tensor tpu;
  at::Tensor cpu;
  const void* data;
};

// Runs `op` on CPU kernels over aliases of its tpu tensors, and maps the results back: a
// result that is an argument's alias is that argument (in-place, out=), a view of one is the
// same view of the tpu tensor, anything else becomes a tpu tensor over the CPU kernel's memory.
void alias_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  check_devices(op, *stack, first);
  std::vector<Aliased> aliased;
  auto alias = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
    at::Tensor a = cpu_alias(t);
    aliased.push_back({t, a, a.storage().data()});
    return a;
  };
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isTensor()) {
      v = alias(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list.vec()) out.push_back(alias(t));
      v = out;
    } else if (v.isOptionalTensorList()) {
      auto list = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list.vec()) {
        out.push_back(t.has_value() ? std::optional<at::Tensor>(alias(*t)) : std::nullopt);
      }
      v = out;
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::IValue(c10::Device(c10::kCPU));
    } else if (v.isNone() && schema.arguments()[i].name() == "generator") {
      v = c10::IValue(tpu_generator());
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  auto map_back = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || r.device().type() == c10::DeviceType::PrivateUse1) return r;
    for (const Aliased& a : aliased) {
      if (r.unsafeGetTensorImpl() == a.cpu.unsafeGetTensorImpl()) return a.tpu;
    }
    for (const Aliased& a : aliased) {
      if (r.storage().unsafeGetStorageImpl() == a.cpu.storage().unsafeGetStorageImpl()) {
        return tpu_tensor_over(a.tpu.storage(), r.dtype(), r.sizes(), r.strides(),
                               r.storage_offset());
      }
    }
    return tpu_retag(r);
  };
  for (const Aliased& a : aliased) write_back(a.tpu, a.cpu, a.data);
  const size_t nret = schema.returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& r = (*stack)[i];
    if (r.isTensor()) {
      r = map_back(r.toTensor());
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : r.toTensorList().vec()) out.push_back(map_back(t));
      r = out;
    }
  }
}

bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Materialises before a call on `stack` that is not recorded, unless it is an in-place or out=
// call that holds no device memory (`zero_` of an empty tensor: it writes nothing; an out=
// tensor it resizes flushes in `resize_`). A functional call runs first: its fresh results are
// written eagerly.
void materialise_for(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t nargs = op.schema().arguments().size();
  if (op.schema().is_mutable() && !holds_device_memory(stack, stack.size() - nargs, nargs)) return;
  materialise(op_key(op));
}

// The entry of a boxed kernel at the key: in fused mode with the native recorder, true when
// the recorder took the call; else, after flushing what the call needs, false (the caller runs
// it).
// Set while PyTorch's generic kernel runs a functional call the recorder declined: the out=
// call it makes reaches the fallback, and is not handed to `record` again (one decline a call).
thread_local bool t_declined = false;

bool recorded_at_entry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_installed();
  serial_on_engine_thread();
  if (g_api->mode() != TPUK_MODE_RECORD) return false;
  if (!t_declined && try_record(op, stack)) return true;
  materialise_for(op, *stack);
  return false;
}

// Every op no kernel is registered for at the key: recorded in fused mode with the native
// recorder when it takes the call; else counted, then the alias fallback.
void counted_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                      torch::jit::Stack* stack) {
  if (recorded_at_entry(op, stack)) return;
  std::string full = op_key(op);
  g_api->fell_back(reinterpret_cast<uintptr_t>(&op.schema()), full.data(), full.size());
  if (g_api->mode() != TPUK_MODE_DEBUG) {
    alias_fallback(op, stack);
    return;
  }
  const size_t nargs = op.schema().arguments().size();
  DebugState debug = debug_before(op, *stack, stack->size() - nargs, nargs);
  alias_fallback(op, stack);
  debug_after(op, *stack, op.schema().returns().size(), debug, false);
}

// ----- ops PyTorch routes to a backend's own kernels -----

void count_fallback(const char* name) {
  materialise(name);
  // The name's address identifies the op for the process's life.
  g_api->fell_back(reinterpret_cast<uintptr_t>(name), name, std::strlen(name));
}

std::optional<at::Tensor> cpu_alias_opt(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return cpu_alias(*t);
}

at::Tensor tpu_of(const at::Tensor& t) { return t.defined() ? tpu_retag(t) : t; }

// A convolution on a backend other than CPU or CUDA reaches `convolution_overrideable`: PyTorch's
// CPU convolution over the same memory.
at::Tensor tpu_convolution(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  static const char kName[] = "aten::convolution_overrideable.default";
  if (g_api->mode() == TPUK_MODE_RECORD) {
    // Recorded as the op it computes, which the graph lowering takes.
    static const c10::OperatorHandle conv =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
    torch::jit::Stack stack{input,        weight,      bias, stride.vec(), padding.vec(),
                            dilation.vec(), transposed, output_padding.vec(), groups};
    if (record_call(&conv, &stack, 0, 9, {})) return stack[0].toTensor();
  }
  count_fallback(kName);
  return tpu_of(at::convolution(cpu_alias(input), cpu_alias(weight), cpu_alias_opt(bias), stride,
                                padding, dilation, transposed, output_padding, groups));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  static const char kName[] = "aten::convolution_backward_overrideable.default";
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  if (g_api->mode() == TPUK_MODE_RECORD) {
    // Recorded with every output: the ones the mask leaves out are dropped at once, so no
    // program computes them (XLA removes what no output reads).
    static const c10::OperatorHandle conv_backward =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
    torch::jit::Stack stack{grad_output,    input,   weight,        c10::IValue(bias_sizes),
                            stride.vec(),   padding.vec(), dilation.vec(), transposed,
                            output_padding.vec(), groups, std::vector<bool>{true, true, true}};
    if (record_call(&conv_backward, &stack, 0, 11, {})) {
      auto kept = [&](size_t k) { return output_mask[k] ? stack[k].toTensor() : at::Tensor(); };
      return {kept(0), kept(1), kept(2)};
    }
  }
  count_fallback(kName);
  auto [gi, gw, gb] = at::convolution_backward(
      cpu_alias(grad_output), cpu_alias(input), cpu_alias(weight),
      output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(), stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  return {tpu_of(gi), tpu_of(gw), tpu_of(gb)};
}

// `histc` of integers: PyTorch's CPU kernel takes floating types only (CUDA's takes integers
// too, and transformers relies on it off the CPU), so integers are counted in double.
at::Tensor tpu_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min,
                     const at::Scalar& max) {
  static const char kName[] = "aten::histc.default";
  if (g_api->mode() == TPUK_MODE_RECORD) {
    // Recorded as itself: the graph lowering bins integers too (in f64, as here).
    static const c10::OperatorHandle histc =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::histc", "");
    torch::jit::Stack stack{self, bins, min, max};
    if (record_call(&histc, &stack, 0, 4, {})) return stack[0].toTensor();
  }
  count_fallback(kName);
  at::Tensor x = cpu_alias(self);
  if (at::isFloatingType(x.scalar_type())) return tpu_of(at::histc(x, bins, min, max));
  return tpu_of(at::histc(x.to(at::kDouble), bins, min, max).to(x.scalar_type()));
}

// `_grouped_mm` (a mixture-of-experts layer's grouped matmul) has no CPU kernel: PyTorch's
// composite one reads the group offsets on the host and writes one `mm` per group into rows of
// its output. Under the native recorder that read is a flush, and each group's product a value
// over part of the output, which the ops reading the whole output cannot be recorded over. It is
// recorded as itself (the graph lowering takes its three forms); otherwise, and when the
// recorder declines it, it runs the composite kernel as before.
at::Tensor tpu_grouped_mm(const at::Tensor& self, const at::Tensor& mat2,
                          const std::optional<at::Tensor>& offs,
                          const std::optional<at::Tensor>& bias,
                          std::optional<at::ScalarType> out_dtype) {
  if (g_api->mode() == TPUK_MODE_RECORD) {
    static const c10::OperatorHandle grouped_mm =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::_grouped_mm", "");
    torch::jit::Stack stack{self, mat2, offs, bias, out_dtype};
    if (record_call(&grouped_mm, &stack, 0, 5, {})) return stack[0].toTensor();
  }
  return at::compositeexplicitautograd::_grouped_mm(self, mat2, offs, bias, out_dtype);
}

// PyTorch's SDPA asks the device's backend which fused attention it takes; without an answer a
// PrivateUse1 device gets the math decomposition. The device answers as the CPU does, so SDPA
// calls `_scaled_dot_product_flash_attention_for_cpu`, which kernels bind at
// the key (and the fallback runs on the CPU kernel when they decline).
int64_t tpu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p,
                             bool is_causal, std::optional<double> scale, bool enable_gqa) {
  // The CPU's rule reads only metadata. Real tensors are asked about through their CPU aliases.
  // Fake ones (torch.compile's tracing) have no memory, and a fake mode would answer with its
  // meta rule (math for any device but CUDA's kind): they are asked about through plain CPU
  // tensors of their metadata, made and asked outside Python dispatch (at trace time only;
  // their pages are never touched).
  bool fake = query.key_set().has(c10::DispatchKey::Python);
  c10::impl::ExcludeDispatchKeyGuard no_python(
      fake ? c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot})
           : c10::DispatchKeySet());
  // Whether a tensor requires grad is part of the rule (flash attention gives a mask no
  // gradient), so the CPU tensors carry it.
  auto as_cpu = [fake](const at::Tensor& t) -> at::Tensor {
    at::Tensor c = fake ? at::empty_strided(t.sizes(), t.strides(),
                                            at::TensorOptions().dtype(t.scalar_type()).device(c10::kCPU))
                        : cpu_alias(t);
    if (t.requires_grad()) c.set_requires_grad(true);
    return c;
  };
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) mask = as_cpu(*attn_mask);
  return at::_fused_sdp_choice(as_cpu(query), as_cpu(key), as_cpu(value), mask, dropout_p,
                               is_causal, scale, enable_gqa);
}

// ----- kernels at the key -----

at::Tensor wrap_output(const TpukOut& o) {
  if (o.absent) return at::Tensor();
  auto dtype = static_cast<c10::ScalarType>(o.dtype);
  c10::IntArrayRef sizes(o.sizes, static_cast<size_t>(o.ndim));
  size_t nbytes = c10::multiply_integers(sizes) * c10::elementSize(dtype);
  c10::DataPtr dp(o.data, o.handle, g_api->release, tpu_device());
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(dp), &g_allocator, true));
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), kTpuKeys,
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

// ----- the native recorder -----

void copy_message(const std::string& m, char* err, size_t cap);

// The call `record` is handed: what `keep` keeps of it.
struct CallContext {
  const c10::OperatorHandle* op;
  // The call's `nargs` arguments.
  const c10::IValue* args;
  size_t nargs;
  // Bit i: argument i is a device tensor left out of `args` (its slot None), as the unboxed
  // entry passes them (`record_unboxed`).
  uint64_t device_args;
};

// A recorded call as the shim keeps it until the flush: its operator and its arguments, with
// the tensors left out (their positions kept): holding them would keep every recorded value
// alive, and the recorder finds them by memory.
struct KeptCall {
  explicit KeptCall(const c10::OperatorHandle& o) : op(o) {}
  c10::OperatorHandle op;
  // Inline: a kept call is one allocation.
  c10::SmallVector<c10::IValue, 6> args;
  // Where the device tensors went, in stack order: an argument position, and the entries of a
  // tensor list that held one (none for a tensor argument).
  struct Position {
    size_t arg;
    bool list;
    std::vector<int64_t> entries;
  };
  c10::SmallVector<Position, 3> tensor_positions;
  size_t ntensors = 0;
};

// Null when it cannot keep it (the recorder then declines the call).
void* keep_call(void* call) noexcept {
  try {
    auto* c = static_cast<CallContext*>(call);
    auto kept = std::make_unique<KeptCall>(*c->op);
    kept->args.reserve(c->nargs);
    kept->tensor_positions.reserve(c->nargs);
    auto on_device = [](const at::Tensor& t) {
      return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
    };
    for (size_t i = 0; i < c->nargs; ++i) {
      const c10::IValue& v = c->args[i];
      // Device tensors are left out (the recorder gives their memory at a replay); a CPU
      // scalar stays. A list keeps its length and its None entries.
      if (((c->device_args >> i) & 1) != 0 || (v.isTensor() && on_device(v.toTensor()))) {
        kept->tensor_positions.push_back({i, false, {}});
        kept->ntensors += 1;
        kept->args.emplace_back();
      } else if (v.isTensorList() || v.isOptionalTensorList()) {
        std::vector<int64_t> entries;
        c10::List<std::optional<at::Tensor>> holes;
        int64_t j = 0;
        auto add = [&](const std::optional<at::Tensor>& t) {
          if (t.has_value() && on_device(*t)) entries.push_back(j);
          // A CPU tensor (indices) is kept as it is now: the call may write it after.
          const bool cpu = t.has_value() && t->defined() && !on_device(*t);
          holes.push_back(cpu ? std::optional<at::Tensor>(t->clone()) : std::nullopt);
          ++j;
        };
        if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorList().vec()) add(t);
        } else {
          for (const auto& t : v.toOptionalTensorList().vec()) add(t);
        }
        kept->ntensors += entries.size();
        kept->tensor_positions.push_back({i, true, std::move(entries)});
        kept->args.push_back(v.isTensorList() ? c10::IValue(c10::List<at::Tensor>())
                                              : c10::IValue(std::move(holes)));
        if (v.isTensorList()) {
          // Its length, as undefined tensors the replay fills.
          auto list = kept->args.back().toTensorList();
          list.resize(static_cast<size_t>(j));
        }
      } else {
        kept->args.push_back(v);
      }
    }
    return kept.release();
  } catch (...) {
    return nullptr;
  }
}

void drop_call(void* kept) noexcept { delete static_cast<KeptCall*>(kept); }

// Runs a kept call on PyTorch's CPU kernels over the memory the recorder gives (the trace's
// program failed): a recorded trace replayed call by call.
int32_t replay_call(void* k, const TpukArg* tensors, size_t ntensors, const TpukArg* outs,
                    size_t nouts, char* err, size_t cap) noexcept {
  auto* kept = static_cast<KeptCall*>(k);
  try {
    TORCH_CHECK(ntensors == kept->ntensors, "replay: ", ntensors,
                " tensors for a call that took ", kept->ntensors);
    torch::jit::Stack stack(kept->args.begin(), kept->args.end());
    size_t next = 0;
    auto tensor = [&]() {
      const TpukArg& a = tensors[next++];
      c10::IntArrayRef sizes(a.sizes, static_cast<size_t>(a.len));
      c10::IntArrayRef strides(a.strides, static_cast<size_t>(a.len));
      return at::from_blob(
          const_cast<void*>(a.data), sizes, strides,
          at::TensorOptions().dtype(static_cast<c10::ScalarType>(a.dtype)).device(c10::kCPU));
    };
    for (const auto& [pos, list, entries] : kept->tensor_positions) {
      c10::IValue& slot = stack[pos];
      if (!list) {
        slot = tensor();
      } else if (slot.isTensorList()) {
        // A fresh list: the kept one is shared with every earlier copy of the stack.
        std::vector<at::Tensor> list = slot.toTensorList().vec();
        for (int64_t j : entries) list[static_cast<size_t>(j)] = tensor();
        slot = c10::IValue(c10::List<at::Tensor>(list));
      } else {
        std::vector<std::optional<at::Tensor>> list = slot.toOptionalTensorList().vec();
        for (int64_t j : entries) list[static_cast<size_t>(j)] = tensor();
        slot = c10::IValue(c10::List<std::optional<at::Tensor>>(list));
      }
    }
    for (c10::IValue& v : stack) {
      if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
        v = c10::IValue(c10::Device(c10::kCPU));
      }
    }
    kept->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    TORCH_CHECK(stack.size() == nouts, "replay: ", stack.size(), " results where ", nouts,
                " were recorded");
    for (size_t i = 0; i < nouts; ++i) {
      at::Tensor r = stack[i].toTensor();
      const TpukArg& o = outs[i];
      at::from_blob(const_cast<void*>(o.data), c10::IntArrayRef(o.sizes, static_cast<size_t>(o.len)),
                    c10::IntArrayRef(o.strides, static_cast<size_t>(o.len)), r.options())
          .copy_(r);
    }
    return TPUK_RAN;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, cap);
    return TPUK_ERROR;
  }
}

const TpukRecordHooks kRecordHooks = {&keep_call, &replay_call, &drop_call};

// What the recorder needs of a schema, worked out once per thread and op.
struct SchemaInfo {
  // Whether the recorder may be handed its calls: one that writes an argument, returns a view
  // or anything but tensors, or draws random numbers runs as strict mode runs it.
  bool recordable = true;
  // Per argument: the kind an int passed there has (TPUK_INT, or what the schema's type says:
  // a dtype, a layout, a memory format).
  std::vector<int32_t> int_kinds;
};

const SchemaInfo& schema_info(const c10::FunctionSchema& schema) {
  thread_local std::unordered_map<const c10::FunctionSchema*, SchemaInfo> cache;
  auto it = cache.find(&schema);
  if (it != cache.end()) return it->second;
  SchemaInfo info;
  info.recordable = !schema.is_mutable();
  for (const auto& r : schema.returns()) {
    if (r.alias_info() != nullptr || r.type()->kind() != c10::TypeKind::TensorType) {
      info.recordable = false;
    }
  }
  for (const auto& a : schema.arguments()) {
    c10::TypePtr t = a.real_type();
    if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
    int32_t kind = TPUK_INT;
    switch (t->kind()) {
      case c10::TypeKind::GeneratorType: info.recordable = false; break;
      case c10::TypeKind::ScalarTypeType: kind = TPUK_DTYPE; break;
      case c10::TypeKind::LayoutType: kind = TPUK_LAYOUT; break;
      case c10::TypeKind::MemoryFormatType: kind = TPUK_MEMORY_FORMAT; break;
      default: break;
    }
    info.int_kinds.push_back(kind);
  }
  return cache.emplace(&schema, std::move(info)).first->second;
}

// What an in-place (`add_`) or out= (`add.out`) op computes: its functional overload
// (`add.Tensor`), whose arguments are the op's first ones, and the arguments the op writes, in
// the order of its results. `op` is empty when there is no such overload.
struct Functional {
  std::optional<c10::OperatorHandle> op;
  std::vector<size_t> written;
};

const Functional& functional_of(const c10::OperatorHandle& op) {
  static std::mutex lock;
  static std::unordered_map<const c10::FunctionSchema*, Functional> cache;
  static std::map<std::string, std::vector<std::string>> overloads;
  std::lock_guard<std::mutex> guard(lock);
  const auto& schema = op.schema();
  auto it = cache.find(&schema);
  if (it != cache.end()) return it->second;
  Functional f;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) f.written.push_back(i);
  }
  bool ok = !f.written.empty() && schema.returns().size() == f.written.size();
  for (const auto& r : schema.returns()) {
    ok = ok && r.type()->kind() == c10::TypeKind::TensorType && r.alias_info() != nullptr &&
         r.alias_info()->isWrite();
  }
  std::string base = schema.name();
  const bool in_place = ok && !args[f.written[0]].is_out();
  size_t nfunctional = args.size();
  if (in_place) {
    ok = f.written.size() == 1 && !base.empty() && base.back() == '_';
    if (ok) base.pop_back();
  } else if (ok) {
    // The out= arguments come last.
    nfunctional = args.size() - f.written.size();
    for (size_t k = 0; k < f.written.size(); ++k) {
      ok = ok && f.written[k] == nfunctional + k && args[f.written[k]].is_out();
    }
  }
  if (ok) {
    if (overloads.empty()) {
      for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
        overloads[n.name].push_back(n.overload_name);
      }
    }
    for (const std::string& overload : overloads[base]) {
      auto h = c10::Dispatcher::singleton().findOp({base, overload});
      if (!h) continue;
      const auto& fs = h->schema();
      if (fs.is_mutable() || fs.returns().size() != f.written.size() ||
          fs.arguments().size() != nfunctional) {
        continue;
      }
      bool same = true;
      for (size_t k = 0; k < nfunctional && same; ++k) {
        same = fs.arguments()[k].name() == args[k].name() &&
               fs.arguments()[k].type()->str() == args[k].type()->str();
      }
      if (same) {
        f.op = *h;
        break;
      }
    }
  }
  return cache.emplace(&schema, std::move(f)).first->second;
}

// Fused mode with the native recorder: hands the call to `record` (an in-place or out= call as
// its functional op, written into the tensors it writes). True when it was recorded: the stack
// then holds its results, which the flush fills.
bool record_call(const c10::OperatorHandle* target, torch::jit::Stack* stack, size_t first,
                 size_t nargs, std::vector<at::Tensor> written);

// The operator `name.overload` (it must exist).
c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Batch norm's training forward writes the running statistics, though neither its schema
// (`native_batch_norm`) nor its results (`_batch_norm_with_update`) say so as the functional
// rule reads them: it is recorded as `_native_batch_norm_legit_functional`, the new running
// statistics written into the old ones' memory. Its backward (`batch_norm_backward`) is recorded
// as `native_batch_norm_backward`, every output asked for (the lowering takes no absent one) and
// those the mask leaves out dropped at once.
std::optional<bool> record_batch_norm(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const c10::OperatorHandle legit = find_op("aten::_native_batch_norm_legit_functional", "");
  static const c10::OperatorHandle native_backward = find_op("aten::native_batch_norm_backward", "");
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  auto arg = [&](size_t i) -> const c10::IValue& { return (*stack)[first + i]; };
  std::vector<c10::IValue> results;
  if (schema.name() == "aten::batch_norm_backward") {
    // (grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
    //  output_mask, reserve)
    const bool weighted = arg(2).isTensor() && arg(2).toTensor().defined();
    c10::List<bool> mask = arg(9).toBoolList();
    torch::jit::Stack local{arg(0), arg(1), arg(2), arg(3), arg(4), arg(5), arg(6), arg(7), arg(8),
                            std::vector<bool>{true, weighted || mask[1], weighted || mask[2]}};
    if (!record_call(&native_backward, &local, 0, 10, {})) return false;
    for (size_t k = 0; k < 3; ++k) {
      results.push_back(mask[k] ? local[k] : c10::IValue(at::Tensor()));
    }
  } else {
    const bool update = schema.name() == "aten::_batch_norm_with_update";
    // native_batch_norm: (input, weight, bias, running_mean, running_var, training, momentum,
    // eps); _batch_norm_with_update: the same without `training`.
    if (!update && !arg(5).toBool()) return false;
    if (!arg(3).isTensor() || !arg(4).isTensor()) return false;
    at::Tensor rm = arg(3).toTensor();
    at::Tensor rv = arg(4).toTensor();
    torch::jit::Stack local{arg(0), arg(1), arg(2), rm, rv, true, arg(update ? 5 : 6),
                            arg(update ? 6 : 7)};
    if (!record_call(&legit, &local, 0, 8, {rm, rv})) return false;
    results = {local[0], local[1], local[2]};
    if (update) {
      // The reserve: empty, as PyTorch's CPU kernel gives it.
      results.emplace_back(at::empty({0}, arg(0).toTensor().options().dtype(at::kByte)));
    }
  }
  torch::jit::drop(*stack, nargs);
  for (c10::IValue& r : results) torch::jit::push(*stack, std::move(r));
  return true;
}

// `index_put_` reaches the device as `_index_put_impl_`, whose extra `unsafe` flag only skips
// PyTorch's bounds checks and which has no functional overload of its own: it is recorded as
// `index_put` written into `self`.
std::optional<bool> record_index_put_impl(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  static const c10::OperatorHandle index_put = find_op("aten::index_put", "");
  // (self, indices, values, accumulate, unsafe)
  const size_t first = stack->size() - 5;
  const c10::IValue& self = (*stack)[first];
  if (!self.isTensor()) return false;
  at::Tensor target = self.toTensor();
  torch::jit::Stack local{self, (*stack)[first + 1], (*stack)[first + 2], (*stack)[first + 3]};
  if (!record_call(&index_put, &local, 0, 4, {target})) return false;
  torch::jit::drop(*stack, 5);
  torch::jit::push(*stack, std::move(local[0]));
  return true;
}

// `cat` (or `cat.out`, as PyTorch hands it to the device) with entries that have no elements
// (an empty KV cache's first `cat`): recorded without
// them, which changes nothing PyTorch computes, as long as they change neither the result's
// dtype nor PyTorch's shape check (each has the first kept entry's dtype, and is 1-d or of its
// sizes but along `dim`). A `cat` with no empty entry is left to the general rule.
std::optional<bool> record_cat_without_empty(const c10::OperatorHandle& op,
                                             torch::jit::Stack* stack) {
  static const c10::OperatorHandle cat = find_op("aten::cat", "");
  const size_t nargs = op.schema().arguments().size();
  const bool out = nargs == 3;
  const size_t first = stack->size() - nargs;
  if (out && !(*stack)[first + 2].isTensor()) return std::nullopt;
  const c10::IValue& list = (*stack)[first];
  if (!list.isTensorList()) return std::nullopt;
  std::vector<at::Tensor> all = list.toTensorList().vec();
  std::vector<at::Tensor> kept;
  for (const at::Tensor& t : all) {
    if (t.numel() > 0) kept.push_back(t);
  }
  if (kept.size() == all.size() || kept.empty()) return std::nullopt;
  const int64_t rank = kept[0].dim();
  int64_t dim = (*stack)[first + 1].toInt();
  if (dim < -rank || dim >= rank) return std::nullopt;
  if (dim < 0) dim += rank;
  for (const at::Tensor& t : all) {
    if (t.scalar_type() != kept[0].scalar_type()) return std::nullopt;
    // PyTorch skips a 1-d empty entry; any other must fit the others but along `dim`, or
    // PyTorch's error is what the caller gets.
    if (t.numel() > 0 || (t.dim() == 1 && t.size(0) == 0)) continue;
    if (t.dim() != rank) return std::nullopt;
    for (int64_t d = 0; d < rank; ++d) {
      if (d != dim && t.size(d) != kept[0].size(d)) return std::nullopt;
    }
  }
  torch::jit::Stack local{c10::IValue(c10::List<at::Tensor>(kept)), (*stack)[first + 1]};
  std::vector<at::Tensor> written;
  if (out) {
    local.push_back((*stack)[first + 2]);
    written.push_back((*stack)[first + 2].toTensor());
  }
  if (!record_call(&cat, &local, 0, nargs, std::move(written))) return false;
  torch::jit::drop(*stack, nargs);
  torch::jit::push(*stack, std::move(local[0]));
  return true;
}

// An out= call's out tensors that PyTorch left empty (it resizes them in the kernel) get the
// sizes the functional op's meta function gives, so the recorded call can write them. Resizing
// an empty storage allocates and writes nothing. False when the meta function gives no answer
// or another dtype, or strides that are not row-major (PyTorch would restride the out).
bool size_empty_outs(const c10::OperatorHandle& target, const torch::jit::Stack& stack,
                     size_t first, size_t ntarget, const std::vector<at::Tensor>& outs) {
  auto empty = [](const at::Tensor& t) {
    return t.defined() && t.numel() == 0 && t.storage().nbytes() == 0;
  };
  if (std::none_of(outs.begin(), outs.end(), empty)) return true;
  std::vector<at::Tensor> expected;
  if (!meta_outputs(target, stack, first, ntarget, expected) || expected.size() != outs.size()) {
    return false;
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!empty(outs[k])) continue;
    const at::Tensor& e = expected[k];
    if (!e.defined() || e.scalar_type() != outs[k].scalar_type() || !e.is_contiguous()) {
      return false;
    }
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    if (empty(outs[k])) at::native::resize_(outs[k], expected[k].sizes(), std::nullopt);
  }
  return true;
}

// `arange.start_out`, as PyTorch hands every `arange` to the device, has no functional overload
// of its arguments: it is recorded as `arange.start_step` of the out tensor's dtype, written into
// the out tensor.
std::optional<bool> record_arange_out(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  static const c10::OperatorHandle start_step = find_op("aten::arange", "start_step");
  // (start, end, step, out)
  const size_t first = stack->size() - 4;
  if (!(*stack)[first + 3].isTensor()) return false;
  at::Tensor out = (*stack)[first + 3].toTensor();
  torch::jit::Stack local{(*stack)[first],     (*stack)[first + 1], (*stack)[first + 2],
                          out.scalar_type(),   c10::IValue(),       out.device(),
                          c10::IValue(),       out};
  if (!size_empty_outs(start_step, local, 0, 7, {out})) return false;
  if (!record_call(&start_step, &local, 0, 8, {out})) return false;
  torch::jit::drop(*stack, 4);
  torch::jit::push(*stack, std::move(local[0]));
  return true;
}

// How the ops the general rule cannot record as they come are recorded: the call recorded
// (true), declined (false), or left to the general rule (nullopt).
using SpecialRecord = std::optional<bool> (*)(const c10::OperatorHandle&, torch::jit::Stack*);

SpecialRecord special_record(const c10::OperatorHandle& op) {
  static const std::unordered_map<const c10::FunctionSchema*, SpecialRecord> table = [] {
    const std::tuple<const char*, const char*, SpecialRecord> entries[] = {
        {"aten::native_batch_norm", "", &record_batch_norm},
        {"aten::_batch_norm_with_update", "", &record_batch_norm},
        {"aten::batch_norm_backward", "", &record_batch_norm},
        {"aten::cat", "", &record_cat_without_empty},
        {"aten::cat", "out", &record_cat_without_empty},
        {"aten::_index_put_impl_", "", &record_index_put_impl},
        {"aten::arange", "start_out", &record_arange_out},
    };
    std::unordered_map<const c10::FunctionSchema*, SpecialRecord> t;
    for (const auto& [name, overload, f] : entries) t[&find_op(name, overload).schema()] = f;
    return t;
  }();
  auto it = table.find(&op.schema());
  return it == table.end() ? nullptr : it->second;
}

bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (SpecialRecord special = special_record(op)) {
    if (std::optional<bool> recorded = special(op, stack)) return *recorded;
  }
  const size_t nargs = op.schema().arguments().size();
  const size_t first = stack->size() - nargs;
  const c10::OperatorHandle* target = &op;
  std::vector<at::Tensor> written;
  if (op.schema().is_mutable()) {
    const Functional& f = functional_of(op);
    if (!f.op) return false;
    target = &*f.op;
    for (size_t w : f.written) {
      const c10::IValue& v = (*stack)[first + w];
      if (!v.isTensor()) return false;
      written.push_back(v.toTensor());
    }
    const size_t ntarget = target->schema().arguments().size();
    if (ntarget < nargs && !size_empty_outs(*target, *stack, first, ntarget, written)) return false;
  }
  return record_call(target, stack, first, nargs, std::move(written));
}

// Records `target` on the `nargs` arguments from `first` on (its own come first), its outputs
// written into `written` when given; on success the call's arguments on the stack are
// replaced by its results.
bool record_call(const c10::OperatorHandle* target, torch::jit::Stack* stack, size_t first,
                 size_t nargs, std::vector<at::Tensor> written) {
  const auto& schema = target->schema();
  const SchemaInfo& info = schema_info(schema);
  if (!info.recordable) return false;
  const size_t ntarget = schema.arguments().size();
  const size_t nret = schema.returns().size();
  Scratch scratch;
  Args args;
  marshal(*stack, first, ntarget, scratch, args);
  // What an int stands for, the schema says; tensor lists go over as lists.
  for (size_t i = 0; i < ntarget; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (v.isDevice()) {
      args[i].kind = TPUK_DEVICE;
    } else if (v.isInt()) {
      args[i].kind = info.int_kinds[i];
    } else if (v.isTensorList() || v.isOptionalTensorList()) {
      std::vector<TpukArg> list;
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(tensor_arg(t));
      } else {
        for (const auto& t : v.toOptionalTensorList().vec()) {
          list.push_back(t.has_value() ? tensor_arg(*t) : tensor_arg(at::Tensor()));
        }
      }
      scratch.lists.push_back(std::move(list));
      args[i].kind = TPUK_TENSOR_LIST;
      args[i].data = scratch.lists.back().data();
      args[i].len = static_cast<int32_t>(scratch.lists.back().size());
      args[i].i = v.isOptionalTensorList() ? 1 : 0;
    }
  }
  Args into;
  for (const at::Tensor& t : written) into.push_back(tensor_arg(t));
  // The first results are fresh, the last `written.size()` written into `written`.
  TORCH_CHECK(written.size() <= nret, "record: ", written.size(), " written tensors for ", nret,
              " results");
  Outs outs(nret - written.size());
  CallContext call{target, stack->data() + first, ntarget, 0};
  const auto key = reinterpret_cast<uintptr_t>(&schema);
  int32_t r = g_api->record(key, args.data(), ntarget, into.data(), into.size(), outs.data(),
                            outs.size(), nullptr, &call);
  if (r == TPUK_NEED_TYPES) {
    std::vector<at::Tensor> expected;
    bool has = meta_outputs(*target, *stack, first, ntarget, expected);
    std::vector<TpukArg> flat;
    for (const at::Tensor& t : expected) flat.push_back(tensor_arg(t));
    std::string name = op_key(*target);
    std::string names;
    for (const auto& a : schema.arguments()) names += a.name() + "\n";
    TpukOpInfo op_info{name.data(), name.size(), names.data(), names.size(), flat.data(),
                       has ? static_cast<ptrdiff_t>(flat.size()) : -1};
    r = g_api->record(key, args.data(), ntarget, into.data(), into.size(), outs.data(),
                      outs.size(), &op_info, &call);
  }
  TORCH_CHECK(r != TPUK_ERROR, last_message());
  if (r != TPUK_RAN) return false;
  Results results;
  for (const TpukOut& o : outs) results.push_back(wrap_output(o));
  for (at::Tensor& t : written) results.push_back(std::move(t));
  torch::jit::drop(*stack, nargs);
  for (at::Tensor& t : results) torch::jit::push(*stack, std::move(t));
  return true;
}

// The kernel of one bound op overload: its arguments go to the Rust dispatcher as `TpukArg`s;
// a declined call runs the fallback (Rust counted it with its reason).
struct KernelAtKey final : c10::OperatorKernel {
  explicit KernelAtKey(uint32_t id) : id_(id) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    run(op, stack, true);
  }

  // `may_record` false: the recorder already declined the call.
  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool may_record) {
    const auto& schema = op.schema();
    const size_t nargs = schema.arguments().size();
    const size_t nret = schema.returns().size();
    const size_t first = stack->size() - nargs;
    check_devices(op, *stack, first);
    if (g_api->mode() == TPUK_MODE_RECORD) {
      if (may_record && try_record(op, stack)) return;
      materialise_for(op, *stack);
    }
    Scratch scratch;
    Args args;
    marshal(*stack, first, nargs, scratch, args);
    DebugState debug;
    if (g_api->mode() == TPUK_MODE_DEBUG) debug = debug_before(op, *stack, first, nargs);
    Outs outs(nret);
    int32_t r = g_api->call(id_, args.data(), nargs, outs.data(), nret);
    if (r == TPUK_ERROR) {
      TORCH_CHECK(false, last_message());
    }
    if (r == TPUK_DECLINED) {
      alias_fallback(op, stack);
      if (debug.on) debug_after(op, *stack, nret, debug, false);
      return;
    }
    // Wrap every output before touching the stack, so that nothing leaks if one throws.
    Results results;
    results.reserve(nret);
    for (const TpukOut& o : outs) results.push_back(wrap_output(o));
    torch::jit::drop(*stack, nargs);
    for (at::Tensor& t : results) torch::jit::push(*stack, std::move(t));
    if (debug.on) debug_after(op, *stack, nret, debug, true);
  }

 private:
  uint32_t id_;
};

// ----- the unboxed entry -----
//
// A boxed kernel at the key costs every call a stack: each tensor argument is copied onto it,
// and a tensor whose only reference was its Python object takes the GIL back twice (PyTorch
// keeps the object alive while C++ holds a second reference). Ops whose arguments are only
// tensors and scalars, returning one tensor (`mul.Tensor`, `add.Tensor`, `silu`: most
// pointwise ops), get their kernel at the key unboxed too: in fused mode with the native
// recorder, a call whose tensors are on the device (or 0-dim on the CPU) goes to `record`
// with nothing boxed. Any other call, and the first call of a signature (its meta function
// runs on a stack), runs the boxed kernel as before; a declined call runs it without a second
// `record`.

enum class Unboxed { kRecorded, kDeclined, kBoxed };

// Calls the unboxed entry recorded (`tpu_kernels._device.unboxed_records()`).
std::atomic<uint64_t> g_unboxed_records{0};

bool unboxed_arg(const at::Tensor& t, size_t i, TpukArg& a, c10::IValue& slot, uint64_t& device) {
  if (!t.defined()) return false;
  if (t.device().type() == c10::DeviceType::PrivateUse1) {
    a = tensor_arg(t);
    device |= uint64_t{1} << i;
    return true;
  }
  // A CPU scalar (Python's `x * 2.0`): kept with the call, as the boxed path keeps it.
  if (!t.device().is_cpu() || t.dim() != 0) return false;
  a = tensor_arg(t);
  slot = c10::IValue(t);
  return true;
}

bool unboxed_arg(const c10::Scalar& x, size_t, TpukArg& a, c10::IValue& slot, uint64_t&) {
  std::memset(&a, 0, sizeof a);
  if (x.isSymbolic()) return false;
  if (x.isFloatingPoint()) {
    a.kind = TPUK_DOUBLE;
    a.d = x.toDouble();
  } else if (x.isBoolean()) {
    a.kind = TPUK_BOOL;
    a.i = x.toBool();
  } else if (x.isIntegral(false)) {
    a.kind = TPUK_INT;
    a.i = x.toLong();
  } else {
    return false;  // complex
  }
  slot = c10::IValue(x);
  return true;
}

template <class... A>
Unboxed record_unboxed(const c10::OperatorHandle& op, at::Tensor& result, const A&... a) {
  check_installed();
  serial_on_engine_thread();
  if (g_api->mode() != TPUK_MODE_RECORD) return Unboxed::kBoxed;
  const auto& schema = op.schema();
  if (!schema_info(schema).recordable) return Unboxed::kBoxed;
  constexpr size_t n = sizeof...(A);
  std::array<TpukArg, n> args;
  std::array<c10::IValue, n> slots;
  uint64_t device = 0;
  size_t i = 0;
  bool ok = true;
  auto one = [&](const auto& x) {
    ok = ok && unboxed_arg(x, i, args[i], slots[i], device);
    ++i;
  };
  (one(a), ...);
  if (!ok) return Unboxed::kBoxed;
  TpukOut out;
  std::memset(&out, 0, sizeof out);
  CallContext call{&op, slots.data(), n, device};
  const auto key = reinterpret_cast<uintptr_t>(&schema);
  int32_t r = g_api->record(key, args.data(), n, nullptr, 0, &out, 1, nullptr, &call);
  if (r == TPUK_NEED_TYPES) return Unboxed::kBoxed;
  TORCH_CHECK(r != TPUK_ERROR, last_message());
  if (r != TPUK_RAN) return Unboxed::kDeclined;
  result = wrap_output(out);
  g_unboxed_records.fetch_add(1, std::memory_order_relaxed);
  return Unboxed::kRecorded;
}

// The unboxed kernel over `boxed(op, stack, may_record)`, the op's boxed kernel.
template <class Boxed, class... A>
c10::KernelFunction unboxed_kernel(c10::OperatorHandle op, Boxed boxed) {
  return c10::KernelFunction::makeFromUnboxedLambda(
      [op, boxed](c10::DispatchKeySet, const A&... a) -> at::Tensor {
        at::Tensor result;
        const Unboxed u = record_unboxed(op, result, a...);
        if (u == Unboxed::kRecorded) return result;
        torch::jit::Stack stack;
        stack.reserve(sizeof...(A));
        (stack.emplace_back(a), ...);
        boxed(op, &stack, u == Unboxed::kBoxed);
        return std::move(stack.back()).toTensor();
      });
}

// The unboxed kernel for `op`'s signature (tensors and scalars in one of the orders below,
// one tensor returned), or none.
template <class Boxed>
std::optional<std::pair<c10::KernelFunction, c10::impl::CppSignature>> unboxed_for(
    const c10::OperatorHandle& op, Boxed boxed) {
  const auto& schema = op.schema();
  if (schema.is_mutable() || schema.returns().size() != 1 ||
      schema.returns()[0].type()->kind() != c10::TypeKind::TensorType ||
      schema.returns()[0].alias_info() != nullptr) {
    return std::nullopt;
  }
  std::string kinds;
  for (const auto& arg : schema.arguments()) {
    // Keyword-only arguments too: a C++ signature takes every argument in schema order.
    if (arg.alias_info() != nullptr) return std::nullopt;
    switch (arg.real_type()->kind()) {
      case c10::TypeKind::TensorType: kinds += 'T'; break;
      case c10::TypeKind::NumberType: kinds += 'S'; break;
      default: return std::nullopt;
    }
  }
  using T = at::Tensor;
  using S = c10::Scalar;
  auto with = [&](auto kernel, auto signature) {
    return std::make_optional(std::make_pair(std::move(kernel), signature));
  };
  if (kinds == "T") {
    return with(unboxed_kernel<Boxed, T>(op, boxed),
                c10::impl::CppSignature::make<T(const T&)>());
  }
  if (kinds == "TT") {
    return with(unboxed_kernel<Boxed, T, T>(op, boxed),
                c10::impl::CppSignature::make<T(const T&, const T&)>());
  }
  if (kinds == "TS") {
    return with(unboxed_kernel<Boxed, T, S>(op, boxed),
                c10::impl::CppSignature::make<T(const T&, const S&)>());
  }
  if (kinds == "TTS") {
    return with(unboxed_kernel<Boxed, T, T, S>(op, boxed),
                c10::impl::CppSignature::make<T(const T&, const T&, const S&)>());
  }
  if (kinds == "TSS") {
    return with(unboxed_kernel<Boxed, T, S, S>(op, boxed),
                c10::impl::CppSignature::make<T(const T&, const S&, const S&)>());
  }
  if (kinds == "TTT") {
    return with(unboxed_kernel<Boxed, T, T, T>(op, boxed),
                c10::impl::CppSignature::make<T(const T&, const T&, const T&)>());
  }
  return std::nullopt;
}

std::mutex g_bind_lock;

// The registrations of kernels bound unboxed, alive as the process is (as the libraries of the
// boxed ones are).
std::vector<c10::RegistrationHandleRAII>& g_bound() {
  static auto* handles = new std::vector<c10::RegistrationHandleRAII>();
  return *handles;
}

// One IMPL library per namespace; it lives as long as the process (kernels stay registered,
// and an op whose kernels were removed is declined by the Rust side).
torch::Library& library_for(const std::string& ns) {
  static std::map<std::string, std::unique_ptr<torch::Library>> libraries;
  auto it = libraries.find(ns);
  if (it == libraries.end()) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                                c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    it = libraries.emplace(ns, std::move(lib)).first;
  }
  return *it->second;
}

// PyTorch's generic kernels for a backend of its own (CompositeExplicitAutogradNonFunctional):
// a structured op's functional form allocates its result on the device, then calls its out=
// form, which reaches the fallback. In fused mode that is two calls at the key for one op, the
// result a real device allocation the recorded call writes into: a recording cost about twice
// a direct one. The functional forms of those ops get a kernel at the key of their own
// (`direct_functional_kernel`): in fused mode it records the functional call directly; else,
// or when the recorder declines, it runs the same generic kernel as before, reached at a
// backend key nobody registers (PrivateUse3), where the alias key put it. The in-place forms
// keep the generic kernel: it writes into `self` through the out= form. Registered once, the
// first time the runtime is installed; a kernel bound to such an op later replaces its entry.
constexpr c10::DispatchKey kGenericKernelKey = c10::DispatchKey::PrivateUse3;

// The generic kernel, on a call not recorded.
void run_generic(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  struct Declined {
    bool was = std::exchange(t_declined, true);
    ~Declined() { t_declined = was; }
  } declined;
  op.redispatchBoxed(c10::DispatchKeySet(kGenericKernelKey), stack);
}

void direct_functional_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
                              torch::jit::Stack* stack) {
  if (recorded_at_entry(op, stack)) return;
  run_generic(op, stack);
}

std::unordered_map<c10::OperatorName, c10::RegistrationHandleRAII>& direct_functional() {
  static std::unordered_map<c10::OperatorName, c10::RegistrationHandleRAII> handles;
  return handles;
}

void register_direct_functional() {
  auto& dispatcher = c10::Dispatcher::singleton();
  auto& handles = direct_functional();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    // The generic kernel must be what the spare backend key computes to (nothing registered
    // there directly).
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        op->hasKernelForDispatchKey(kGenericKernelKey) ||
        !op->hasComputedKernelForDispatchKey(kGenericKernelKey)) {
      continue;
    }
    const auto& schema = op->schema();
    // Functional ops only: nothing written, no result aliasing an argument.
    if (schema.is_mutable()) continue;
    bool aliases = false;
    for (const auto& a : schema.arguments()) aliases = aliases || a.alias_info() != nullptr;
    for (const auto& r : schema.returns()) aliases = aliases || r.alias_info() != nullptr;
    // Ops about allocation and copies, not computation, keep their generic kernels.
    static const char* const kept[] = {"aten::new_empty_strided", "aten::lift_fresh_copy",
                                       "aten::copy"};
    bool keep = std::any_of(std::begin(kept), std::end(kept),
                            [&](const char* k) { return name.name == k; });
    if (aliases || keep) continue;
    auto boxed = [](const c10::OperatorHandle& o, torch::jit::Stack* stack, bool may_record) {
      if (may_record) return direct_functional_kernel(o, {}, stack);
      materialise_for(o, *stack);
      run_generic(o, stack);
    };
    if (auto unboxed = unboxed_for(*op, boxed)) {
      try {
        handles.emplace(name, dispatcher.registerImpl(name, c10::DispatchKey::PrivateUse1,
                                                      std::move(unboxed->first), unboxed->second,
                                                      nullptr,
                                                      "tpu_kernels: direct functional form"));
        continue;
      } catch (const std::exception&) {
        // A C++ signature other than the schema's usual one: the boxed kernel below.
      }
    }
    handles.emplace(name, dispatcher.registerImpl(
                              name, c10::DispatchKey::PrivateUse1,
                              c10::KernelFunction::makeFromBoxedFunction<&direct_functional_kernel>(),
                              std::nullopt, nullptr, "tpu_kernels: direct functional form"));
  }
}

void copy_message(const std::string& m, char* err, size_t cap) {
  if (cap == 0) return;
  size_t n = std::min(m.size(), cap - 1);
  std::memcpy(err, m.data(), n);
  err[n] = '\0';
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&counted_fallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", tpu_empty);
  m.impl("empty_strided", tpu_empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", tpu_resize);
  m.impl("_copy_from", tpu_copy_from);
  m.impl("_copy_from_and_resize", tpu_copy_from_and_resize);
  m.impl("_local_scalar_dense", tpu_local_scalar_dense);
  m.impl("set_", tpu_set_empty);
  m.impl("set_.source_Storage", at::native::set_);
  m.impl("set_.source_Storage_storage_offset", at::native::set_storage_cpu_);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
  m.impl("convolution_overrideable", tpu_convolution);
  m.impl("convolution_backward_overrideable", tpu_convolution_backward);
  m.impl("histc", tpu_histc);
  m.impl("_grouped_mm", tpu_grouped_mm);
  // PyTorch's generic kernel for a backend of its own (CompositeExplicitAutogradNonFunctional)
  // writes into a 0-dim out= tensor that the CPU kernel then resizes, with a deprecation
  // warning on every call: the fallback runs the CPU's functional kernel instead.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&counted_fallback>());
}

// Autocast on the device (`torch.autocast("tpu", dtype=torch.bfloat16)`) follows the policy
// PyTorch publishes for accelerators, the lists of ATen/autocast_mode.h that CUDA's autocast
// registers too: matmuls and convolutions in the lower precision, reductions, norms and losses
// in f32, mixed inputs promoted. Ops on no list pass through.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

namespace at::autocast {
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPUK_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPUK_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPUK_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPUK_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(TPUK_LOWER_PRECISION_FP)
  AT_FORALL_FP32(TPUK_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPUK_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPUK_PROMOTE)
#undef TPUK_LOWER_PRECISION_FP
#undef TPUK_FP32
#undef TPUK_FP32_SET_OPT_DTYPE
#undef TPUK_PROMOTE
}
}  // namespace at::autocast

extern "C" {

// Installs the Rust runtime's table; 0 on success, else an error text in `err`.
int tpuk_shim_install(const TpukDeviceApi* api, char* err, size_t cap) {
  if (api == nullptr || api->abi != TPUK_DEVICE_ABI || api->size != sizeof(TpukDeviceApi)) {
    copy_message("the tpu device's runtime table does not match this shim (rebuild both)", err,
                 cap);
    return 1;
  }
  static bool hooks_registered = false;
  g_api = api;
  api->connect(&kRecordHooks);
  if (!hooks_registered) {
    try {
      std::lock_guard<std::mutex> guard(g_bind_lock);
      register_direct_functional();
    } catch (const std::exception& e) {
      direct_functional().clear();  // none stays half registered
      copy_message(std::string("registering the functional forms at the key: ") + e.what(), err,
                   cap);
      return 1;
    }
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
    at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&tpu_fused_sdp_choice);
    hooks_registered = true;
  }
  return 0;
}

// Registers the kernel of `ns::name.overload` at the key under Rust's op id `id`.
int tpuk_shim_bind(const char* ns, const char* name, const char* overload, uint32_t id, char* err,
                   size_t cap) {
  try {
    std::lock_guard<std::mutex> guard(g_bind_lock);
    std::string qualified = std::string(ns) + "::" + name;
    auto handle = c10::Dispatcher::singleton().findOp({qualified, overload});
    if (!handle) {
      copy_message("no operator " + qualified + "." + overload, err, cap);
      return 1;
    }
    for (const auto& ret : handle->schema().returns()) {
      if (ret.type()->kind() != c10::TypeKind::TensorType) {
        copy_message(qualified + "." + overload + " returns a " + ret.type()->str() +
                         ", not tensors",
                     err, cap);
        return 1;
      }
    }
    // The fallback's direct entry for a functional form gives way to the kernel.
    direct_functional().erase(handle->operator_name());
    std::string impl_name = std::string(name) + (*overload ? std::string(".") + overload : "");
    auto kernel = std::make_shared<KernelAtKey>(id);
    auto boxed = [kernel](const c10::OperatorHandle& o, torch::jit::Stack* stack, bool may_record) {
      kernel->run(o, stack, may_record);
    };
    if (auto unboxed = unboxed_for(*handle, boxed)) {
      try {
        g_bound().push_back(c10::Dispatcher::singleton().registerImpl(
            handle->operator_name(), c10::DispatchKey::PrivateUse1, std::move(unboxed->first),
            unboxed->second, nullptr, "tpu_kernels: bound kernel"));
        return 0;
      } catch (const std::exception&) {
        // A C++ signature other than the schema's usual one: the boxed kernel below.
      }
    }
    library_for(ns).impl(impl_name.c_str(),
                         torch::CppFunction::makeFromBoxedFunctor(
                             std::make_unique<KernelAtKey>(id)));
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, cap);
    return 1;
  }
}

uint64_t tpuk_shim_unboxed_records() { return g_unboxed_records.load(std::memory_order_relaxed); }

void tpuk_shim_manual_seed(uint64_t seed) {
  at::Generator& gen = tpu_generator();
  std::lock_guard<std::mutex> guard(gen.mutex());
  gen.set_current_seed(seed);
}

// Copies the generator's state into `buf` (when `cap` is large enough) and returns its size.
size_t tpuk_shim_rng_state(uint8_t* buf, size_t cap) {
  at::Generator& gen = tpu_generator();
  std::lock_guard<std::mutex> guard(gen.mutex());
  at::Tensor state = gen.get_state();
  size_t n = static_cast<size_t>(state.numel());
  if (buf != nullptr && cap >= n) std::memcpy(buf, state.const_data_ptr(), n);
  return n;
}

// Sets the generator's state from `len` bytes; 0 on success, else an error text in `err`.
int tpuk_shim_set_rng_state(const uint8_t* data, size_t len, char* err, size_t cap) {
  try {
    at::Tensor state = at::empty({static_cast<int64_t>(len)}, at::kByte);
    if (len > 0) std::memcpy(state.mutable_data_ptr(), data, len);
    at::Generator& gen = tpu_generator();
    std::lock_guard<std::mutex> guard(gen.mutex());
    gen.set_state(state);
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, cap);
    return 1;
  }
}

uint64_t tpuk_shim_initial_seed() { return tpu_generator().current_seed(); }

uint64_t tpuk_shim_seed() {
  at::Generator& gen = tpu_generator();
  std::lock_guard<std::mutex> guard(gen.mutex());
  return gen.seed();
}

}  // extern "C"
