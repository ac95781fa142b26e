"""Contexts (one per CUDA device, created on first use, kept for the process),
errors and the library's log.

A flexjit context is not thread-safe: every call that takes one holds its
lock. Contexts are never destroyed, so the specs and kernels loaded into them
stay valid until the process exits.
"""
import ctypes
import logging
import threading

from . import _lib
from ._lib import lib

logger = logging.getLogger("flexjit")

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}


class FlexjitError(RuntimeError):
    """A failed library call. str(e) is the library's message (a spec's
    errors start with `chunk:line:`); e.status is the fj_status value and
    e.status_name its name ("FJ_ELUA")."""

    def __init__(self, message, status=-1):
        super().__init__(message)
        self.status = status
        self.status_name = lib.fj_status_name(status).decode()


def _on_log(user, level, msg):
    logger.log(_LEVELS.get(level, logging.WARNING), "%s",
               msg.decode("utf-8", "replace"))


# Kept alive for the process: the library calls it from any later call.
_LOG_CALLBACK = _lib.LOG_FN(_on_log)


class Context:
    """One fj_context for one CUDA device."""

    def __init__(self, device):
        opts = _lib.ContextOptions()
        lib.fj_context_options_init(ctypes.byref(opts))
        opts.device = device
        opts.log = _LOG_CALLBACK
        ptr = ctypes.c_void_p()
        st = lib.fj_context_create(ctypes.byref(opts), ctypes.byref(ptr))
        if st != 0:
            raise FlexjitError(f"fj_context_create failed ({lib.fj_status_name(st).decode()})", st)
        self.ptr = ptr.value
        self.device = device
        self.lock = threading.RLock()
        # The torch integration's per-signature launch structs and wrapped
        # block masks (python/flexjit/_torch.py), guarded by the lock.
        self.forward_launches = {}
        self.backward_launches = {}
        self.wrapped_masks = {}

    def error(self, status, what=None):
        """A FlexjitError carrying this context's last message (call with the
        lock held, right after the failed call)."""
        msg = lib.fj_context_last_error(self.ptr).decode("utf-8", "replace")
        if not msg:
            msg = lib.fj_status_name(status).decode()
        if what:
            msg = f"{what}: {msg}"
        return FlexjitError(msg, status)

    def check(self, status, what=None):
        if status != 0:
            raise self.error(status, what)


_contexts = {}
_contexts_lock = threading.Lock()
_packs = []


def context(device=0):
    """The context of CUDA device `device` (creating it, and mounting every
    pack mount_pack was given, on first use)."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    with _contexts_lock:
        ctx = _contexts.get(device)
        if ctx is None:
            ctx = Context(device)
            for path in _packs:
                with ctx.lock:
                    ctx.check(lib.fj_context_mount_pack(ctx.ptr, path))
            _contexts[device] = ctx
    return ctx


def mount_pack(path):
    """Mounts a kernel pack (a .fjpack file from `flexjit precompile` or
    flexjit.precompile) read-only in every context, present and future.
    Packs are searched, in mount order, before the disk cache; with them a
    machine without NVRTC runs the kernels they hold. $FLEXJIT_PACKS mounts
    packs too."""
    raw = str(path).encode()
    with _contexts_lock:
        ctxs = list(_contexts.values())
        if not ctxs:
            ctxs = [Context(0)]
            _contexts[0] = ctxs[0]
        for ctx in ctxs:
            with ctx.lock:
                ctx.check(lib.fj_context_mount_pack(ctx.ptr, raw))
        _packs.append(raw)


def version():
    """The linked library's version string ("0.1.0")."""
    return lib.fj_version_string().decode()
