// The C ABI between the "tpu" device's C++ shim (this crate, `tpu_kernels._device`) and the Rust
// runtime in `tpu_kernels._native`. The shim adapts PyTorch's C++ interfaces (allocator, device
// guard, hooks, kernels at the PrivateUse1 key, the fallback); every decision is made behind
// these function pointers, in Rust. `_native` hands the table over as a PyCapsule
// (`tpu_kernels._native.device_api`); its Rust mirror is `pallas_bridge/src/device.rs`, and
// both sides check `abi` and `size` before use.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define TPUK_DEVICE_ABI 6
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
  // Only in `record`, where the schema's argument types say what an int is: a scalar type
  // (its c10::ScalarType code), a layout, a memory format (c10's codes); a device.
  TPUK_DTYPE = 9,
  TPUK_LAYOUT = 10,
  TPUK_MEMORY_FORMAT = 11,
  TPUK_DEVICE = 12,
  // Only in `record`: a list of tensors (`Tensor[]`, `Tensor?[]`); `data` points to `len`
  // TpukArgs, each a tensor or TPUK_NONE; `i` is 1 for `Tensor?[]` (indices), else 0.
  TPUK_TENSOR_LIST = 13,
};

// Where a tensor argument lives (`TpukArg::device`).
enum { TPUK_ON_CPU = 0, TPUK_ON_TPU = 1, TPUK_ON_OTHER = 2 };

// The device's eager mode (`mode`).
// TPUK_MODE_FUSED is fused mode recorded in Python, above the device (the shim runs calls as
// in strict mode); TPUK_MODE_RECORD is fused mode recorded here, through `record`.
enum { TPUK_MODE_STRICT = 0, TPUK_MODE_DEBUG = 1, TPUK_MODE_FUSED = 2, TPUK_MODE_RECORD = 3 };

// What `call` answers.
enum {
  // The kernel ran: the outputs are filled in.
  TPUK_RAN = 0,
  // No kernel takes the call (counted with its reason): run the op's fallback.
  TPUK_DECLINED = 1,
  // An error to raise: `message` has the text.
  TPUK_ERROR = 2,
  // `record` only: call again with the op's info (`TpukOpInfo`).
  TPUK_NEED_TYPES = 3,
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
  // Int list: int64_t[len]. Bool list: uint8_t[len]. Tensor list: TpukArg[len].
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

// What `record` is told of an op the first time it sees a signature of it.
typedef struct {
  // `ns::op.overload` (`.default` for the default overload).
  const char* name;
  size_t name_len;
  // The schema's argument names, each followed by '\n'.
  const char* arg_names;
  size_t arg_names_len;
  // The outputs of the op's meta function (TPUK_NONE for an undefined one); `nexpected < 0`
  // when it has none.
  const TpukArg* expected;
  ptrdiff_t nexpected;
} TpukOpInfo;

// The shim's side of recording, handed over once (`connect`).
typedef struct {
  // Keeps the call `call` (the context given to `record`): its operator and non-tensor
  // arguments; returns what it kept.
  void* (*keep)(void* call);
  // Runs a kept call on PyTorch's CPU kernels, its tensor arguments (in stack order) over the
  // memory `tensors` describe, writing its outputs into the memory `outs` describe. TPUK_RAN, or
  // TPUK_ERROR with the error's text in `err` (at most `cap` bytes, NUL-terminated).
  int32_t (*replay)(void* kept, const TpukArg* tensors, size_t ntensors, const TpukArg* outs,
                    size_t nouts, char* err, size_t cap);
  void (*drop)(void* kept);
} TpukRecordHooks;

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
  // Fused mode with the native recorder: the call of the op `key` identifies (its schema's
  // address) with `args` (kinds from the schema's types), `nouts + ninto` outputs: the first
  // `nouts` into fresh placeholders (`outs`), the last `ninto` written into the memory of the
  // tensors `into` gives (an in-place or out= call recorded as its functional op, a batch norm's
  // running statistics). TPUK_RAN: recorded, the flush fills the outputs; TPUK_DECLINED: flush,
  // then run it as strict mode does; TPUK_NEED_TYPES: call again with `info`; TPUK_ERROR. `call`
  // is the shim's context for `TpukRecordHooks::keep`.
  int32_t (*record)(uintptr_t key, const TpukArg* args, size_t nargs, const TpukArg* into,
                    size_t ninto, TpukOut* outs, size_t nouts, const TpukOpInfo* info, void* call);
  // Runs what was recorded (`reason` names the materialisation point). TPUK_RAN or TPUK_ERROR.
  int32_t (*flush)(const char* reason, size_t len);
  // Device memory whose storage died: `drop(ctx)` runs now, or after the flush while a trace
  // that may read it is pending.
  void (*retire)(void* ctx, void (*drop)(void*));
  // Hands over the shim's recording hooks.
  void (*connect)(const TpukRecordHooks* hooks);
  // Fused mode with the native recorder: the value of the one-element device tensor `self`
  // (what `.item()` reads) into `out` (`len` bytes, its element size) without running the
  // pending trace, when it is known exactly. TPUK_RAN: `out` holds it; TPUK_DECLINED: flush
  // first; TPUK_ERROR.
  int32_t (*scalar)(const TpukArg* self, uint8_t* out, size_t len);
} TpukDeviceApi;
