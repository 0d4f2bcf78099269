"""Every use of numba's internals, in one module.

The kernels use numba's public API: ``numba.njit``, ``numba.types``, ``numba.config``,
``numba.extending`` and the low-level helpers numba's extension guide teaches
(``numba.core.cgutils``, ``errors``, ``imputils``, ``datamodel``). What vq needs beyond that is
here, and nowhere else: :class:`Kernel`, the dispatcher of every kernel (its first call loads a
cached compilation without numba's compiler, :func:`load_cached`; it types read-only arrays as
writable, :func:`writable`), the cache objects swapped onto numba's own
(:class:`SafeFunctionCache`, :class:`SharedCacheFile`), the IR inliner's block copy
(:func:`install_inliner`), the garbage collector's pause while a kernel compiles
(:func:`collector_paused`), the compile events (:func:`on_compile`) and the dispatcher's
fingerprints (:func:`pretyped`).

All of it was written and tested against the numba releases of :data:`NUMBA_RANGE`, the
range ``pyproject.toml`` pins. Under a numba outside it none of it is used: :func:`njit` is
plain ``numba.njit`` (compiled in memory in every process, with no disk cache), numba's
inliner stays as shipped, and one warning at import says so (:data:`SUPPORTED` False).
"""

from __future__ import annotations

import copy
import functools
import gc
import hashlib
import os
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numba
from numba._dispatcher import compute_fingerprint
from numba.core import config as numba_config
from numba.core import event, types
from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher
from numba.core.runtime import rtsys
from numba.extending import typeof_impl

from vq.kernels.jit.locks import locked

#: the numba releases vq's use of numba's internals was checked against: at least the first,
#: below the second (``pyproject.toml``: ``numba>=0.59,<0.69``)
NUMBA_RANGE = ("0.59", "0.69")

#: the type of a numba dispatcher (what ``numba.njit`` returns)
Dispatcher = CPUDispatcher


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: ``"0.68.1rc1"`` -> (0, 68, 1)."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def supported(version: str) -> bool:
    """Whether numba ``version`` lies in :data:`NUMBA_RANGE` (a pre-release of the upper
    bound, ``0.69.0rc1``, does not)."""
    release = _release(version)
    return bool(release) and _release(NUMBA_RANGE[0]) <= release < _release(NUMBA_RANGE[1])


def _check_version() -> bool:
    version = numba.__version__
    if supported(version):
        return True
    low, high = NUMBA_RANGE
    warnings.warn(
        f"vq: numba {version} is outside the releases vq's kernels were checked against "
        f"(numba>={low},<{high}); kernels compile with numba as shipped, in memory in every "
        f"process (no disk cache). Install numba>={low},<{high} to compile them once per "
        "machine.",
        RuntimeWarning,
        stacklevel=2,
    )
    return False


#: whether this numba is in :data:`NUMBA_RANGE` (else nothing below patches or reads numba's
#: internals)
SUPPORTED = _check_version()
_lock = threading.RLock()


def njit(func: Callable, options: dict, cache_dir: str | None) -> Dispatcher:
    """``numba.njit(**options)(func)``, disk-cached in ``cache_dir`` (None: in memory), as a
    :class:`Kernel` with vq's cache objects; plain ``numba.njit`` where numba is not
    :data:`SUPPORTED` or the JIT is disabled (``NUMBA_DISABLE_JIT``)."""
    if not SUPPORTED:
        return numba.njit(cache=False, **options)(func)
    with _lock:
        previous = numba_config.CACHE_DIR
        numba_config.CACHE_DIR = previous if cache_dir is None else cache_dir
        try:
            dispatcher = numba.njit(cache=cache_dir is not None, **options)(func)
        finally:
            numba_config.CACHE_DIR = previous
    if type(dispatcher) is CPUDispatcher:  # (not under NUMBA_DISABLE_JIT)
        dispatcher.__class__ = Kernel  # the same object, two methods more
        if type(dispatcher._cache) is FunctionCache:
            dispatcher._cache.__class__ = SafeFunctionCache
        cache_file = getattr(dispatcher._cache, "_cache_file", None)
        if type(cache_file) is IndexDataCacheFile and SharedCacheFile.fits(cache_file):
            cache_file.__class__ = SharedCacheFile  # (else numba's own, as shipped)
    return dispatcher


class Kernel(CPUDispatcher):
    """A numba dispatcher whose first call in a process loads a cached kernel directly.

    numba's own first call prepares its whole compiler (registering every typing and lowering
    rule, importing scipy for BLAS) before it looks in the cache: most of what a first search
    costs. Loading compiled code needs none of that (only numba's runtime, for the arrays a
    kernel allocates), so a kernel's call that finds no compilation goes to :attr:`first_call`
    (:mod:`vq.kernels.jit.cache` sets it: the cache first, then a background or a local
    compile), which reaches numba's compiler only through the ``compile`` it is handed.

    A read-only array (a fixture frozen with ``setflags(write=False)``, ``np.frombuffer`` of
    bytes, ``np.load(mmap_mode="r")``), in a tuple or a named tuple too, is typed as a
    writable one, so that it runs the code compiled for writable arrays instead of compiling
    the kernel a second time. vq's kernels write only arrays vq allocated (their outputs and
    an index's own buffers), never an argument that came from the user.
    """

    #: ``first_call(dispatcher, args, compile) -> entry point``, where ``compile()`` is numba's
    #: own path (typing, compiling, saving)
    first_call: Callable | None = None

    def typeof_pyval(self, val):
        return writable(super().typeof_pyval(val))

    def _compile_for_args(self, *args, **kws):
        compile_here = collector_paused(functools.partial(super()._compile_for_args, *args, **kws))
        if kws or Kernel.first_call is None:
            install_inliner()  # before numba's compiler first runs in this process
            return compile_here()
        return Kernel.first_call(self, args, compile_here)


def writable(tp: types.Type) -> types.Type:
    """``tp`` with each array in it (in tuples and named tuples too) writable."""
    if isinstance(tp, types.Array) and not tp.mutable:
        return tp.copy(readonly=False)
    if isinstance(tp, types.BaseTuple):
        inner = [writable(t) for t in tp.types]
        if inner != list(tp.types):
            if isinstance(tp, types.BaseNamedTuple):
                return types.BaseTuple.from_types(inner, tp.instance_class)
            return types.Tuple(inner)  # (a UniTuple again where they are all the same)
    return tp


class _Typed(tuple):
    """A tuple that carries its numba type (``_numba_type_``): what :func:`pretyped` gives."""


@typeof_impl.register(_Typed)
def _typeof_typed(val, c):  # (numba's typing in Python: a compile, or a plain dispatcher)
    return val._numba_type_


def pretyped(value: tuple) -> tuple:
    """``value`` (a plain tuple); where the dispatcher would type it in Python on every call
    (it holds a :class:`~vq.kernels.common.constants.Static`, say), the same tuple carrying its
    numba type, read in C. For a tuple made once and passed on many calls."""
    if not SUPPORTED:
        return value
    try:
        compute_fingerprint(value)
        return value  # (typed in C)
    except Exception:
        pass
    typed = _Typed(value)
    typed._numba_type_ = writable(numba.typeof(tuple(value)))
    return typed


def argtypes(dispatcher: Dispatcher, args: tuple) -> tuple | None:
    """The numba types of ``args`` as ``dispatcher`` types them; None where one cannot be
    typed (numba's own path then reports it)."""
    try:
        return tuple(dispatcher.typeof_pyval(a) for a in args)
    except Exception:
        return None


def has_disk_cache(dispatcher: Dispatcher) -> bool:
    """Whether ``dispatcher`` keeps its compilations in a disk cache."""
    return isinstance(getattr(dispatcher, "_cache", None), FunctionCache)


def load_cached(dispatcher: Dispatcher, argtypes: tuple | None) -> Any:
    """The entry point of ``dispatcher``'s compilation for ``argtypes``: one it holds, or one
    loaded from its disk cache (now added to its overloads) without numba's compiler; None
    where there is none (or it cannot be loaded this way)."""
    cache = getattr(dispatcher, "_cache", None)
    if not isinstance(cache, FunctionCache) or argtypes is None:
        return None
    with global_compiler_lock:
        existing = dispatcher.overloads.get(argtypes)
        if existing is not None:
            return existing.entry_point
        context = dispatcher.targetctx
        try:
            rtsys.initialize(context)  # the allocator the kernels' arrays use
            cres = cache._load_overload(argtypes, context)
        except Exception:
            return None
        if cres is None or cres.objectmode:
            return None
        dispatcher._cache_hits[argtypes] += 1
        context.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
        dispatcher.add_overload(cres)
        _loaded[0] += 1
        return cres.entry_point


_loaded = [0]


def loads() -> int:
    """How many compilations :func:`load_cached` has loaded from a disk cache in this
    process."""
    return _loaded[0]


def compile_types(dispatcher: Dispatcher, argtypes: tuple) -> None:
    """Compile ``dispatcher`` for ``argtypes`` (numba types), saving it in its cache."""
    install_inliner()
    collector_paused(dispatcher.compile)(argtypes)


# -- the garbage collector during a compile ----------------------------------------------------
# numba's compiler allocates millions of small objects (IR nodes, their copies, typing state),
# and each allocation burst triggers Python's cyclic collector, which walks every object the
# process holds (torch's alone are some 400,000): a quarter of a kernel's compile. The collector
# is paused while vq's kernels compile (with no effect on the code compiled) and resumed, if it
# ran before, when the last compile in progress ends; the garbage of the compile is then
# collected as usual.
_collector_lock = threading.Lock()
_collector_depth = 0
_collector_was_on = False


def collector_paused(compile_: Callable) -> Callable:
    """``compile_`` wrapped so that Python's cyclic garbage collector is off while it runs
    (see above); calls in several threads at once share one pause."""

    @functools.wraps(compile_)
    def paused(*args, **kwargs):
        global _collector_depth, _collector_was_on
        with _collector_lock:
            if _collector_depth == 0:
                _collector_was_on = gc.isenabled()
                gc.disable()
            _collector_depth += 1
        try:
            return compile_(*args, **kwargs)
        finally:
            with _collector_lock:
                _collector_depth -= 1
                if _collector_depth == 0 and _collector_was_on:
                    gc.enable()

    return paused


class SharedCacheFile(IndexDataCacheFile):
    """numba's index + data files of a kernel, safe for processes that compile at once.

    numba names a new entry's data file by the first number its index does not use yet: two
    processes compiling two signatures of one kernel together (pytest workers, ``vq warmup
    --jobs``, torchrun processes) could both read the index before either wrote it, pick the same
    name, and leave the index pointing one signature at the other's machine code; a later process
    then ran code compiled for other argument types. Here a data file is named by a hash of its
    key (the signature, the CPU, the sources' stamp), so no two keys share one, and the index's
    read-modify-write holds an exclusive lock on a file beside it, so no entry is lost. Used
    only where numba's file has the layout this relies on.
    """

    _NUMBER = "{number:d}"

    @classmethod
    def fits(cls, cache_file: IndexDataCacheFile) -> bool:
        """Whether ``cache_file`` names its data files as this class expects."""
        pattern = getattr(cache_file, "_data_name_pattern", None)
        return isinstance(pattern, str) and pattern.count(cls._NUMBER) == 1

    def save(self, key, data):
        with locked(self._index_path + ".lock"):
            overloads = self._load_index()
            data_name = overloads.get(key)
            if data_name is None:
                digest = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
                data_name = self._data_name_pattern.replace(self._NUMBER, digest)
                overloads[key] = data_name
                self._save_index(overloads)
            self._save_data(data_name, data)

    def _load_index(self):
        try:
            return super()._load_index()
        except Exception as err:  # garbage or a foreign file: a miss, rewritten by a save
            _unreadable(self._index_path, err)
            return {}

    def _load_data(self, name):
        try:
            return super()._load_data(name)
        except OSError:
            raise
        except Exception as err:
            _unreadable(self._data_path(name), err)
            raise OSError(f"unreadable cache entry {name}") from err  # (load: a miss)


class SafeFunctionCache(FunctionCache):
    """numba's cache of one kernel, where an entry that cannot be loaded (whatever numba
    raises while reading or rebuilding it) is a miss, compiled again and saved over it, after
    a warning that names the entry; never an error of the call."""

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Exception as err:
            _unreadable(self._cache_path, err)
            return None


_warned_unreadable = [False]


def _unreadable(where: str, err: BaseException) -> None:
    """Warn, once per process, that an entry of the kernel cache could not be read."""
    if _warned_unreadable[0]:
        return
    _warned_unreadable[0] = True
    warnings.warn(
        f"vq: the kernel cache holds an entry that cannot be read ({where}: "
        f"{type(err).__name__}: {err}); it will be compiled again and replaced",
        RuntimeWarning,
        stacklevel=2,
    )


def on_compile(callback: Callable[[Any], None]) -> None:
    """Call ``callback(dispatcher)`` when numba starts compiling one (not on cache loads)."""

    class Listener(event.Listener):
        def on_start(self, ev):
            callback(ev.data.get("dispatcher"))

        def on_end(self, ev):
            pass

    event.register("numba:compile", Listener())


# -- the inliner ------------------------------------------------------------------------------
# numba inlines a call by deep-copying the callee's IR block by block, each block with a fresh
# memo (InlineWorker.inline_ir); every block refers to the function's one scope, which holds all
# its variables, so a copy costs blocks x variables (numba issue #8989). install_inliner gives
# the blocks of one scope one memo for an inline_ir call: the scope is copied once, and the IR
# (so the compiled code) is the same. inline_ir then copies its copy once more, for an
# "original" it returns and both of its callers in numba (InlineInlinables, InlineOverloads)
# drop: while one of vq's kernels compiles (:func:`collector_paused`), that copy is skipped (the
# blocks themselves stand in for it). Only the ``copy`` name inside inline_closurecall and
# InlineWorker.inline_ir change; not with VQ_NUMBA_INLINE_COPY=numba, nor where numba's inliner
# is laid out otherwise.
_inliner_lock = threading.Lock()
_inliner_state = threading.local()
_inliner: bool | None = None


class _BlockCopier:
    """Stands in for the ``copy`` module inside ``numba.core.inline_closurecall``: a block
    copied during ``inline_ir`` shares the memo of the other blocks of its scope; everything
    else is :mod:`copy` itself."""

    def __init__(self, block_type: type):
        self._block_type = block_type

    def deepcopy(self, x: Any, memo: dict | None = None, _nil: Any = None) -> Any:
        memos = getattr(_inliner_state, "memos", None)
        if memo is None and memos is not None and type(x) is self._block_type:
            if id(x.scope) in _inliner_state.copied and _collector_depth > 0:
                return x  # (numba's copy of its own copy, dropped by its callers: see above)
            memo = memos.setdefault(id(x.scope), {})  # the memo keeps the scope (and its id) alive
            block = copy.deepcopy(x, memo)
            _inliner_state.copied.add(id(block.scope))
            return block
        return copy.deepcopy(x, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def install_inliner() -> bool:
    """Share one memo among the blocks of a scope in numba's IR inliner (see above); True
    where it is installed. Idempotent and thread-safe."""
    global _inliner
    if _inliner is not None:
        return _inliner
    with _inliner_lock:
        if _inliner is None:
            _inliner = SUPPORTED and _patch_inliner()
    return _inliner


def _patch_inliner() -> bool:
    if os.environ.get("VQ_NUMBA_INLINE_COPY", "").strip().lower() == "numba":
        return False
    try:
        from numba.core import inline_closurecall, ir
    except ImportError:
        return False
    worker = getattr(inline_closurecall, "InlineWorker", None)
    original = getattr(worker, "inline_ir", None)
    block = getattr(ir, "Block", None)
    # only numba's layout this was written for: the module's `copy` is the copy module itself
    if inline_closurecall.__dict__.get("copy") is not copy or original is None or block is None:
        return False

    @functools.wraps(original)
    def inline_ir(self, *args, **kwargs):
        outer = getattr(_inliner_state, "memos", None), getattr(_inliner_state, "copied", None)
        _inliner_state.memos, _inliner_state.copied = {}, set()  # (the memos keep the ids alive)
        try:
            return original(self, *args, **kwargs)
        finally:
            _inliner_state.memos, _inliner_state.copied = outer

    inline_ir.__wrapped_by_vq__ = True
    worker.inline_ir = inline_ir
    inline_closurecall.copy = _BlockCopier(block)
    return True


def inliner_installed() -> bool:
    """Whether :func:`install_inliner` has patched numba's inliner in this process."""
    return bool(_inliner)
