"""Loading libgradsync.so and declaring its C API for ctypes.

The structs below mirror worker/include/gradsync.h field for field;
tests/python/test_package.py (test_struct_mirrors_match_the_header) compiles
a probe against the header and compares every size and offset, so a change
to the header that is not made here fails the tests instead of corrupting
memory.

Every ctypes call of a CDLL function releases the GIL for its duration, so
waits in the library never stop other Python threads.
"""

import ctypes
import ctypes.util
import os
import re
import sys
import sysconfig

c_int, c_int64, c_size_t, c_double, c_char_p, c_void_p = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_double, ctypes.c_char_p,
    ctypes.c_void_p)
c_uint64 = ctypes.c_uint64

# ---- status codes, dtypes, reduce ops (gradsync.h; explicit, append-only) ----
GS_OK = 0
GS_ERR_INVALID_ARG = 1
GS_ERR_NO_MEMORY = 2
GS_ERR_TIMEOUT = 3
GS_ERR_MISMATCH = 4
GS_ERR_DUPLICATE_NAME = 5
GS_ERR_SHUTDOWN = 12
GS_ERR_UNSUPPORTED = 15
GS_ERR_FORKED = 19  # the context was made in the parent of a fork

GS_FLOAT32, GS_FLOAT64, GS_FLOAT16, GS_BFLOAT16 = 0, 1, 2, 3
GS_INT32, GS_INT64, GS_INT8, GS_UINT8, GS_INT16 = 4, 5, 6, 7, 8

GS_SUM, GS_AVERAGE, GS_MIN, GS_MAX, GS_PRODUCT, GS_ADASUM = 0, 1, 2, 3, 4, 5


class gs_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("coordinator", c_char_p),
        ("rank", c_int),
        ("size", c_int),
        ("local_rank", c_int),
        ("local_size", c_int),
        ("job_token", c_char_p),
        ("advertise_addr", c_char_p),
        ("join_timeout_ms", c_int),
        ("data_timeout_ms", c_int),
        ("scale_local", c_int),
        ("backend", c_char_p),
        ("cuda_device", c_int),
        ("tls_ca", c_char_p),
        ("tls_cert", c_char_p),
        ("tls_key", c_char_p),
    ]


class gs_allreduce_opts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("shape", ctypes.POINTER(c_int64)),
        ("ndim", c_int),
        ("prescale", c_double),
        ("postscale", c_double),
        ("compression", c_int),
        ("gradient_predivide_factor", c_double),
        ("stream", c_void_p),
    ]


class gs_op_opts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("stream", c_void_p),
    ]


class gs_sparse_opts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("sparse_as_dense", c_int),
        ("dense_rows", c_int64),
        ("dense_out", c_void_p),
    ]


class gs_stats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in (
        "plans_executed", "collectives", "tensors", "fused_collectives", "requests_sent",
        "cache_hits", "bytes_to_coordinator", "messages_to_coordinator", "local_ops",
        "plans_replayed", "gpu_collectives", "fast_rounds", "fast_tensors", "fast_escalations",
        "fast_ride_tensors")]


# The structs the ABI test checks: name in gradsync.h -> ctypes mirror.
STRUCTS = {
    "gs_options": gs_options,
    "gs_allreduce_opts": gs_allreduce_opts,
    "gs_op_opts": gs_op_opts,
    "gs_sparse_opts": gs_sparse_opts,
    "gs_stats": gs_stats,
}

_P = c_void_p
_PP = ctypes.POINTER(c_void_p)
_I64P = ctypes.POINTER(c_int64)
_OPTS = ctypes.POINTER(gs_op_opts)

# name: (restype, argtypes)
_PROTOTYPES = {
    "gs_version": (c_char_p, []),
    "gs_options_init": (None, [ctypes.POINTER(gs_options)]),
    "gs_allreduce_opts_init": (None, [ctypes.POINTER(gs_allreduce_opts)]),
    "gs_op_opts_init": (None, [ctypes.POINTER(gs_op_opts)]),
    "gs_sparse_opts_init": (None, [ctypes.POINTER(gs_sparse_opts)]),
    "gs_stats_init": (None, [ctypes.POINTER(gs_stats)]),
    "gs_init": (c_int, [ctypes.POINTER(gs_options), _PP]),
    "gs_shutdown": (c_int, [_P]),
    "gs_rank": (c_int, [_P]),
    "gs_size": (c_int, [_P]),
    "gs_local_rank": (c_int, [_P]),
    "gs_local_size": (c_int, [_P]),
    "gs_register_local": (c_int, [_P, c_char_p]),
    "gs_unregister_local": (c_int, [_P, c_char_p]),
    "gs_is_local": (c_int, [_P, c_char_p]),
    "gs_allreduce_async": (c_int, [_P, c_char_p, _P, _P, c_size_t, c_int, c_int,
                                   ctypes.POINTER(gs_allreduce_opts), _PP]),
    "gs_grouped_allreduce_async": (c_int, [_P, c_size_t, ctypes.POINTER(c_char_p), _PP, _PP,
                                           ctypes.POINTER(c_size_t), c_int, c_int,
                                           ctypes.POINTER(gs_allreduce_opts), _PP]),
    "gs_allreduce_init": (c_int, [_P, c_char_p, _P, _P, c_size_t, c_int, c_int,
                                  ctypes.POINTER(gs_allreduce_opts), _PP]),
    "gs_startall": (c_int, [_P, c_size_t, _PP]),
    "gs_start": (c_int, [_P]),
    "gs_allgather_async": (c_int, [_P, c_char_p, _P, _I64P, c_int, c_int, _OPTS, _PP]),
    "gs_broadcast_async": (c_int, [_P, c_char_p, _P, c_size_t, c_int, c_int, _OPTS, _PP]),
    "gs_alltoall_async": (c_int, [_P, c_char_p, _P, _I64P, c_int, c_int, _I64P, _OPTS, _PP]),
    "gs_alltoall_recv_splits": (c_int, [_P, _I64P, c_size_t]),
    "gs_reducescatter_async": (c_int, [_P, c_char_p, _P, _I64P, c_int, c_int, c_int, _OPTS,
                                       _PP]),
    "gs_sparse_allreduce_async": (c_int, [_P, c_char_p, _I64P, _P, c_size_t, c_size_t, c_int,
                                          c_int, ctypes.POINTER(gs_sparse_opts), _PP]),
    "gs_sparse_result": (c_int, [_P, ctypes.POINTER(_I64P), _PP, ctypes.POINTER(c_size_t)]),
    "gs_handle_result": (c_int, [_P, _PP, ctypes.POINTER(c_size_t)]),
    "gs_handle_result_copy": (c_int, [_P, _P, c_size_t]),
    "gs_allgather_dims": (c_int, [_P, _I64P, c_size_t, _I64P]),
    "gs_barrier": (c_int, [_P]),
    "gs_join": (c_int, [_P, ctypes.POINTER(c_int)]),
    "gs_wait": (c_int, [_P, c_int]),
    "gs_wait_any": (c_int, [_PP, c_size_t, c_int, ctypes.POINTER(c_size_t)]),
    "gs_wait_any_passive": (c_int, [_PP, c_size_t, c_int, ctypes.POINTER(c_size_t)]),
    "gs_nccl_version": (c_int, []),
    "gs_test": (c_int, [_P, ctypes.POINTER(c_int)]),
    "gs_handle_error": (c_char_p, [_P]),
    "gs_handle_free": (None, [_P]),
    "gs_last_error": (c_char_p, [_P]),
    "gs_status_str": (c_char_p, [c_int]),
    "gs_get_stats": (c_int, [_P, ctypes.POINTER(gs_stats)]),
    "gs_dtype_size": (c_size_t, [c_int]),
    "gs_kv_set": (c_int, [_P, c_char_p, _P, c_size_t]),
    "gs_kv_get": (c_int, [_P, c_char_p, c_int, _PP, ctypes.POINTER(c_size_t)]),
    "gs_free": (None, [_P]),
}


def _repo_build_lib():
    # python/gradsync/_lib.py -> <repo>/build/lib
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(repo, "build", "lib", "libgradsync.so")


def _prefix_candidates():
    """libgradsync in the install prefix: the prefix this package was
    installed under, the interpreter's prefix, then the dynamic linker's
    own search (ldconfig cache, LD_LIBRARY_PATH)."""
    here = os.path.abspath(__file__)
    prefixes = []
    # <prefix>/lib/pythonX.Y/site-packages/gradsync/_lib.py (also dist-packages)
    parts = here.split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("site-packages", "dist-packages"):
            p = os.sep.join(parts[:i])
            for _ in range(2):  # lib/pythonX.Y or lib/python3
                p = os.path.dirname(p)
            prefixes.append(os.path.dirname(p) if os.path.basename(p) == "lib" else p)
            break
    for p in (sys.prefix, sys.base_prefix, "/usr/local", "/usr"):
        if p not in prefixes:
            prefixes.append(p)
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    out = []
    for p in prefixes:
        for d in ("lib", os.path.join("lib", multiarch) if multiarch else None, "lib64"):
            if d:
                out.append(os.path.join(p, d, "libgradsync.so.0"))
                out.append(os.path.join(p, d, "libgradsync.so"))
    found = ctypes.util.find_library("gradsync")
    if found:
        out.append(found)
    return out


def _declare(lib):
    missing = []
    for name, (res, args) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = res
        fn.argtypes = args
    return missing


def load():
    """Returns (CDLL, path). Raises ImportError naming every place tried."""
    tried = []
    env = os.environ.get("GRADSYNC_LIB")
    if env:
        candidates = [("GRADSYNC_LIB", env)]
    else:
        candidates = [("install prefix", p) for p in _prefix_candidates()]
        candidates.append(("repository build", _repo_build_lib()))
    for where, path in candidates:
        if os.sep in path and not os.path.exists(path):
            tried.append("%s: %s (no such file)" % (where, path))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (where, path, e))
            continue
        missing = _declare(lib)
        if missing:
            tried.append("%s: %s (too old: lacks %s)" % (where, path, ", ".join(missing[:4])))
            continue
        return lib, path
    hint = ("GRADSYNC_LIB is set, so nothing else was tried; point it at a libgradsync.so of "
            "this version" if env else
            "set GRADSYNC_LIB=/path/to/libgradsync.so, install the library (cmake --install), "
            "or build it in the repository with 'bash scripts/build.sh'")
    raise ImportError("gradsync: could not load libgradsync.so; tried:\n  " +
                      "\n  ".join(tried) + "\n" + hint)


lib, path = load()


# The *_init functions write struct_size and defaults for the struct as the
# loaded library knows it, which may be larger than these mirrors (a newer
# library with appended fields): every struct handed to an *_init lives in a
# zeroed buffer with room to spare, so such a library writes into the spare
# room instead of past the object. Fields beyond the mirror keep the
# library's defaults.
_SPARE = 1024


def new_struct(cls, init):
    buf = ctypes.create_string_buffer(max(ctypes.sizeof(cls), _SPARE))
    obj = cls.from_buffer(buf)  # keeps buf alive
    getattr(lib, init)(ctypes.byref(obj))
    return obj


def options():
    return new_struct(gs_options, "gs_options_init")


def allreduce_opts():
    return new_struct(gs_allreduce_opts, "gs_allreduce_opts_init")


def op_opts(stream=None):
    o = new_struct(gs_op_opts, "gs_op_opts_init")
    o.stream = stream
    return o


def text(b):
    return b.decode("utf-8", "replace") if b else ""


# The library's error texts name its C calls ("wait for it (gs_wait,
# gs_test)"); raised through this package they name the Python calls instead.
# Each C phrase lies whole inside one string literal of libgradsync (no
# format directive in it), so tests/python/test_package.py can check that
# the library still says every one of them: a reworded C text fails that
# test instead of reaching Python users unrewritten. The C texts themselves
# stay as they are for C callers.
PY_PHRASES = (
    ("wait for it (gs_wait, gs_test) before starting it again",
     "wait for it (wait(), test()) before starting it again"),
    ("gs_startall lists this persistent op twice",
     "startall() lists this persistent op twice"),
    ("(gs_register_local) after gs_allreduce_init; a persistent op cannot be local: free it and "
     "use gs_allreduce_async",
     "(register_local_parameter()) after allreduce_init(); a persistent op cannot be local: "
     "free() it and use allreduce_async()"),
    ("(gs_register_local); a persistent op cannot be local: use gs_allreduce_async for it",
     "(register_local_parameter()); a persistent op cannot be local: use allreduce_async() for "
     "it"),
    ("wait for it to complete (gs_wait) before submitting the name again",
     "wait for it to complete (synchronize() its handle, or wait() of a persistent op) before "
     "submitting the name again"),
    ("wait for it first (gs_wait, gs_test)", "wait for it first (synchronize(), poll())"),
    ("gs_shutdown has been called", "shutdown() has been called"),
    ("gs_shutdown was called while this op was in flight",
     "shutdown() was called while this op was in flight"),
    ("GRADSYNC_SIZE (or gs_options), ", "GRADSYNC_SIZE, "),
    ("the process that called gs_init (fork before gs_init, or",
     "the process that called init() (fork before init(), or"),
    ("call gs_init in a process started with exec (e.g. multiprocessing's 'spawn' start method), "
     "or fork before the parent's gs_init or after its gs_shutdown",
     "call init() in a process started with exec (e.g. multiprocessing's 'spawn' start method), "
     "or fork before the parent's init() or after its shutdown()"),
)

# The same for gradsyncd's texts that reach the ranks (in gradsyncd, not in
# the library: tests/python/test_package.py looks for them there). They say
# what another rank did; in a job of this package that rank called
# shutdown().
PY_COORD_PHRASES = (
    ("has already left the job (gs_shutdown), so this collective",
     "has already left the job (shutdown()), so this collective"),
)

# A text that starts with the C call that refused ("gs_init: ...",
# "gs_init (rank 3): ...", "gs_allreduce: tensor name ... is 510 bytes")
# starts with the Python call's name instead ("init(): ...").
_LEADING_CALL = re.compile(r"^gs_([a-z][a-z_]*)(?=[: ])")


def py_text(msg):
    """msg, a libgradsync error text, as a Python user should read it."""
    for c_phrase, py_phrase in PY_PHRASES + PY_COORD_PHRASES:
        msg = msg.replace(c_phrase, py_phrase)
    return _LEADING_CALL.sub(lambda m: m.group(1) + "()", msg, count=1)


def error_text(b):
    """A libgradsync error text (gs_last_error, gs_handle_error) for Python."""
    return py_text(text(b))
