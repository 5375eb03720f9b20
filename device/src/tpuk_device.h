// The C ABI between the "tpu" device's C++ shim (this crate, `tpu_kernels._device`) and the Rust
// runtime in `tpu_kernels._native`. The shim adapts PyTorch's C++ interfaces (allocator, device
// guard, hooks, kernels at the PrivateUse1 key, the fallback); every decision is made behind
// these function pointers, in Rust. `_native` hands the table over as a PyCapsule
// (`tpu_kernels._native.device_api`); its Rust mirror is `pallas_bridge/src/device.rs`, and
// both sides check `abi` and `size` before use.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define TPUK_DEVICE_ABI 3
#define TPUK_MAX_RANK 16

// What one argument of an op call is (`TpukArg::kind`).
enum {
  TPUK_NONE = 0,
  TPUK_TENSOR = 1,
  TPUK_INT = 2,
  TPUK_DOUBLE = 3,
  TPUK_BOOL = 4,
  TPUK_INT_LIST = 5,
  TPUK_BOOL_LIST = 6,
  TPUK_STRING = 7,
  // Anything else (a scalar type is passed as TPUK_INT: its c10::ScalarType code).
  TPUK_OTHER = 8,
};

// Where a tensor argument lives (`TpukArg::device`).
enum { TPUK_ON_CPU = 0, TPUK_ON_TPU = 1, TPUK_ON_OTHER = 2 };

// The device's eager mode (`mode`).
enum { TPUK_MODE_STRICT = 0, TPUK_MODE_DEBUG = 1, TPUK_MODE_FUSED = 2 };

// What `call` answers.
enum {
  // The kernel ran: the outputs are filled in.
  TPUK_RAN = 0,
  // No kernel takes the call (counted with its reason): run the op's fallback.
  TPUK_DECLINED = 1,
  // An error to raise: `message` has the text.
  TPUK_ERROR = 2,
};

typedef struct {
  int32_t kind;
  // Tensor: its c10::ScalarType code.
  int32_t dtype;
  // Tensor: TPUK_ON_*.
  int32_t device;
  // Tensor: rank. Lists: length.
  int32_t len;
  // Tensor: address of its first element (null when it has none). String: its bytes.
  // Int list: int64_t[len]. Bool list: uint8_t[len].
  const void* data;
  // Tensor: sizes[len] and element strides[len].
  const int64_t* sizes;
  const int64_t* strides;
  // Int and bool values; a string's length in bytes.
  int64_t i;
  double d;
} TpukArg;

typedef struct {
  // Host address of the output's elements (dense, row-major).
  void* data;
  // What owns them: the shim hands it to `release` when the storage dies.
  void* handle;
  int32_t dtype;
  int32_t ndim;
  // 1: an output the call's output mask left out (an undefined tensor).
  int32_t absent;
  int32_t reserved;
  int64_t sizes[TPUK_MAX_RANK];
} TpukOut;

typedef struct {
  uint32_t abi;
  uint32_t size;
  // Device memory: `alloc` returns the address (64-byte aligned; null when out of memory, with
  // the reason in `message`) and sets `*ctx` to what `free` takes back.
  void* (*alloc)(size_t nbytes, void** ctx);
  void (*free)(void* ctx);
  // The kernel path of op `op` (the id Python bound it under): `args` as the boxed stack holds
  // them, `nouts` outputs expected. Answers TPUK_RAN, TPUK_DECLINED or TPUK_ERROR.
  int32_t (*call)(uint32_t op, const TpukArg* args, size_t nargs, TpukOut* outs, size_t nouts);
  void (*release)(void* handle);
  // Counts a call that ran in the CPU fallback: `key` identifies the operator for the process's
  // life (its handle's address); `name` is `ns::op.overload` (`.default` for the default
  // overload), read only the first time.
  void (*fell_back)(uintptr_t key, const char* name, size_t len);
  // Device memory the allocator did not give: a fallback result's block, adopted by the device
  // (`bytes > 0` when adopted, `< 0` when its storage dies). For `memory_allocated()`.
  void (*adopted)(ptrdiff_t bytes);
  // The device's eager mode (TPUK_MODE_*).
  int32_t (*mode)(void);
  // Debug mode, before an op: 1 when every floating tensor and float among `args` is finite.
  int32_t (*finite)(const TpukArg* args, size_t nargs);
  // Debug mode, after an op: checks its outputs (`outs`, flattened; TPUK_NONE for an undefined
  // tensor) against those of its meta function (`expected`, dtype and sizes; `nexpected < 0`
  // when it has none) and for NaN from finite inputs. `kernel` is 1 when a kernel computed
  // them, 0 for the fallback. TPUK_RAN when they pass, else TPUK_ERROR with the message.
  int32_t (*check)(const char* name, size_t len, int32_t kernel, int32_t inputs_finite,
                   const TpukArg* outs, size_t nouts, const TpukArg* expected, ptrdiff_t nexpected);
  // Copies the calling thread's last error message into `buf` (at most `cap` bytes, no NUL) and
  // returns its full length.
  size_t (*message)(char* buf, size_t cap);
} TpukDeviceApi;
