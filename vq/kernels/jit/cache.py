"""The kernels' disk cache: each kernel compiles once per machine and configuration, and every
later process loads it.

numba caches a compiled function beside its source file, keyed by the file's time stamp, the
argument types and the CPU. vq keeps that cache in the user's cache directory instead, in a
folder keyed by vq's version, the CPU's name and features (an AVX2 machine and an AVX-512 one
never share an entry, even on a shared home directory) and a hash of the kernel sources (numba
does not notice an edit to a file that a cached kernel calls into; a new hash starts afresh):

    $NUMBA_CACHE_DIR/vq/<key>/    where NUMBA_CACHE_DIR is set,
    $XDG_CACHE_HOME/vq/<key>/     otherwise (~/.cache where XDG_CACHE_HOME is unset).

Kernels specialised by value (a block kernel unrolled over 16 sub-quantizer pairs, tables for
sub-vectors of 4 dimensions) are *template modules*: ordinary modules whose constants stand in
one marked block at the top. :func:`specialise` writes a copy holding the wanted values into the
cache folder and imports it, so each configuration is a source file of its own that numba
caches like any other. (Closures cannot do this: numba refuses to cache one that calls other
closures, and misses on every new process for one that holds an intrinsic.)

Where the folder cannot be created or written, kernels compile in memory in every process,
after one warning. Folders of other versions, CPUs or sources that no process has used for
:data:`UNUSED_DAYS` days are deleted when a new folder is created (each folder's ``.used``
stamp is touched at most once a day).
"""

from __future__ import annotations

import hashlib
import importlib.util
import linecache
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from types import ModuleType

import llvmlite
import llvmlite.binding as llvm
import numba
from numba.core import config as numba_config
from numba.core import event, types
from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher
from numba.core.runtime import rtsys

from vq._version import __version__
from vq.kernels.jit import background, inlining, trust

_BEGIN = "# -- specialised constants"
_END = "# -- end of specialised constants"
#: a kernel folder unused this long is deleted when another one is created
UNUSED_DAYS = 30
_DAY = 86400.0
_lock = threading.RLock()
_specialised: dict[tuple, ModuleType] = {}


def cpu_key() -> str:
    """The CPU's name and a hash of its feature flags, as numba compiles for them."""
    name = numba_config.CPU_NAME or llvm.get_host_cpu_name()
    features = numba_config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    return f"{name}-{hashlib.sha256(features.encode()).hexdigest()[:8]}"


#: the kernels' package (vq.kernels): every module under it is a kernel source but this one's
_KERNELS = Path(__file__).resolve().parents[1]


def _sources_hash() -> str:
    """A hash of every kernel source (``vq.kernels``'s modules, but for this package's, which
    compile nothing), numba's and llvmlite's versions."""
    h = hashlib.sha256(f"{numba.__version__} {llvmlite.__version__}".encode())
    own = Path(__file__).resolve().parent
    for path in sorted(_KERNELS.rglob("*.py")):
        if path.parent == own:
            continue
        h.update(path.relative_to(_KERNELS).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:10]


def cache_root() -> Path:
    """The user's cache directory for vq: ``$NUMBA_CACHE_DIR/vq``, else
    ``$XDG_CACHE_HOME/vq``, else ``~/.cache/vq``."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / "vq"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vq"


def _usable_folder() -> Path | None:
    """This machine's and version's folder, created; None (after a warning) if unwritable."""
    root = cache_root()
    path = root / f"kernels-{__version__}-{cpu_key()}-{_sources_hash()}"
    try:
        created = not path.exists()
        reason = trust.private_folder(root, path)
        if reason is not None:
            warnings.warn(
                f"vq: not using the kernel cache at {path}: {reason}, so other users could "
                "make it run code; kernels will compile in memory in every process. If only "
                "you use that folder, make it private (chmod 700); else point XDG_CACHE_HOME "
                "(or NUMBA_CACHE_DIR) at a folder only you can write.",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        probe = path / f".probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
        _mark_used(path)
        if created:
            prune(path.parent, keep=path)
    except OSError as err:
        warnings.warn(
            f"vq: cannot use the kernel cache at {path} ({err.strerror or err}); kernels will "
            "compile in memory in every process. Point NUMBA_CACHE_DIR or XDG_CACHE_HOME at a "
            "writable directory to compile them once per machine.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return path


def _mark_used(path: Path) -> None:
    """Touch ``path/.used`` unless it was touched in the last day."""
    stamp = path / ".used"
    try:
        if time.time() - stamp.stat().st_mtime < _DAY:
            return
    except FileNotFoundError:
        pass
    stamp.touch()


def prune(root: Path, keep: Path, days: float = UNUSED_DAYS) -> list[Path]:
    """Delete the kernel folders under ``root`` (``kernels-*``) but ``keep`` that no process
    has used for ``days`` days (their ``.used`` stamp, else the folder's own time); returns
    those deleted. A folder in use by another process is never that old."""
    gone = []
    limit = time.time() - days * _DAY
    for other in root.glob("kernels-*"):
        if other == keep or not other.is_dir():
            continue
        stamp = other / ".used"
        try:
            used = (stamp if stamp.exists() else other).stat().st_mtime
        except OSError:
            continue
        if used < limit:
            shutil.rmtree(other, ignore_errors=True)
            gone.append(other)
    return gone


_folder: Path | None = _usable_folder()


def folder() -> Path | None:
    """Where the compiled kernels of this vq version and CPU are kept (None: in memory only)."""
    return _folder


def kernel(**options) -> Callable:
    """``numba.njit(**options)``, disk-cached in :func:`folder` (in memory where there is none,
    or where the function has no source file), loaded from the cache without numba's compiler
    (see :class:`Kernel`)."""

    def decorate(func):
        cache = _folder is not None and os.path.isfile(func.__code__.co_filename)
        with _lock:
            previous = numba_config.CACHE_DIR
            numba_config.CACHE_DIR = str(_folder) if cache else previous
            try:
                dispatcher = numba.njit(cache=cache, **options)(func)
            finally:
                numba_config.CACHE_DIR = previous
        if type(dispatcher) is CPUDispatcher:  # (not under NUMBA_DISABLE_JIT)
            dispatcher.__class__ = Kernel  # the same object, one method more
            if type(dispatcher._cache) is FunctionCache:
                dispatcher._cache.__class__ = SafeFunctionCache
            cache_file = getattr(dispatcher._cache, "_cache_file", None)
            if type(cache_file) is IndexDataCacheFile and SharedCacheFile.fits(cache_file):
                cache_file.__class__ = SharedCacheFile  # (else numba's own, as shipped)
        return dispatcher

    return decorate


class Kernel(CPUDispatcher):
    """A numba dispatcher whose first call in a process loads a cached kernel directly.

    numba's own first call prepares its whole compiler — registering every typing and lowering
    rule, importing scipy for BLAS — before it looks in the cache: about 0.5 s per process on a
    2-core machine, more than everything else a first search does. Loading compiled code needs
    none of that (only numba's runtime, for the arrays a kernel allocates), so a kernel first
    tries the cache itself and leaves numba's full path to the calls that must compile.

    A read-only array (a fixture frozen with ``setflags(write=False)``, ``np.frombuffer`` of
    bytes, ``np.load(mmap_mode="r")``) is typed as a writable one, so that it runs the code
    compiled for writable arrays instead of compiling the kernel a second time (30-70 s for a
    graph kernel on Zen 1). vq's kernels write only arrays vq allocated (their outputs and
    an index's own buffers), never an argument that came from the user.
    """

    def typeof_pyval(self, val):
        return _writable(super().typeof_pyval(val))

    def _compile_for_args(self, *args, **kws):
        if kws:
            inlining.install()  # before numba's compiler first runs in this process
            return super()._compile_for_args(*args, **kws)
        entry = _load_cached(self, args)
        if entry is not None:
            return entry
        if not background.local.waiting and _folder is not None:  # (not_waiting(): hand over)
            argtypes = _argtypes(self, args)
            if argtypes is not None and background.hand_over(self, argtypes, _origin(self)):
                name = self.py_func.__qualname__
                raise background.KernelNotReady(f"{name} is compiling in the background")
        with _compiling(self, args):  # another process may have compiled it while we waited
            entry = _load_cached(self, args)
            if entry is not None:
                return entry
            inlining.install()
            return super()._compile_for_args(*args, **kws)


class SharedCacheFile(IndexDataCacheFile):
    """numba's index + data files of a kernel, safe for processes that compile at once.

    numba names a new entry's data file by the first number its index does not use yet: two
    processes compiling two signatures of one kernel together (pytest workers, ``vq warmup
    --jobs``, torchrun processes) could both read the index before either wrote it, pick the same
    name, and leave the index pointing one signature at the other's machine code; a later process
    then ran code compiled for other argument types (the likely cause, not proven, of a
    ZeroDivisionError once seen in a fast-scan scan during ``vq warmup --jobs 2``). Here a data
    file is named by a hash of its key (the signature, the CPU, the sources' stamp), so no two
    keys share one, and the index's read-modify-write holds an exclusive lock on a file beside
    it, so no entry is lost. Used only where numba's file has the layout this relies on.
    """

    _NUMBER = "{number:d}"

    @classmethod
    def fits(cls, cache_file: IndexDataCacheFile) -> bool:
        """Whether ``cache_file`` names its data files as this class expects."""
        pattern = getattr(cache_file, "_data_name_pattern", None)
        return isinstance(pattern, str) and pattern.count(cls._NUMBER) == 1

    def save(self, key, data):
        with _locked(self._index_path + ".lock"):
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
    """numba's cache of one kernel, where an entry that cannot be loaded — whatever numba
    raises while reading or rebuilding it — is a miss (compiled again and saved over it),
    after a warning that names the cache, never an error of the call."""

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
        f"vq: the kernel cache at {_folder} holds an entry that cannot be read ({where}: "
        f"{type(err).__name__}: {err}); it will be compiled again and replaced",
        RuntimeWarning,
        stacklevel=2,
    )


@contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes (none where the platform has no flock:
    the hashed names alone still keep every entry's code its own)."""
    try:
        import fcntl
    except ImportError:  # (Windows)
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _compiling(dispatcher: Kernel, args: tuple) -> Iterator[None]:
    """Held while this process compiles ``dispatcher`` for ``args``: an exclusive lock, shared
    by every process using the cache folder, on a file named by the kernel and its argument
    types. Processes that start together on a cold cache (torchrun's, pytest's workers, ``vq
    warmup --jobs``) would each compile the same kernel at once, every one paying seconds of
    CPU for the same machine code; with the lock one compiles and saves it, and the others,
    waiting, then load it (``_compile_for_args`` looks again once it holds the lock). Other
    kernels and other argument types compile side by side. No lock where there is no disk
    cache (or no flock); the file goes when its compile is done (a process that opened it
    before then still waits for the compile, one that opens it after finds the kernel)."""
    with _compiling_key(dispatcher, _argtypes(dispatcher, args)):
        yield


@contextmanager
def _compiling_key(dispatcher: Kernel, argtypes: tuple | None) -> Iterator[None]:
    """:func:`_compiling`'s lock, for numba types (none for None)."""
    if _folder is None or not isinstance(dispatcher._cache, FunctionCache) or argtypes is None:
        yield
        return
    func = dispatcher.py_func
    key = f"{func.__module__}.{func.__qualname__}{argtypes}"
    path = _folder / "compiling" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.lock"
    held = ExitStack()
    try:
        path.parent.mkdir(exist_ok=True)
        held.enter_context(_locked(str(path)))
    except OSError:  # (the folder went read-only: compile unlocked, as without a cache)
        held.close()
        yield
        return
    with held:
        try:
            yield
        finally:
            with suppress(OSError):
                path.unlink()


def _writable(tp: types.Type) -> types.Type:
    """``tp`` with each array in it (tuples included) writable."""
    if isinstance(tp, types.Array) and not tp.mutable:
        return tp.copy(readonly=False)
    if isinstance(tp, types.BaseTuple) and not isinstance(tp, types.BaseNamedTuple):
        inner = [_writable(t) for t in tp.types]
        if inner != list(tp.types):
            return types.Tuple(inner)  # (a UniTuple again where they are all the same)
    return tp


def _argtypes(dispatcher: Kernel, args: tuple) -> tuple | None:
    """The numba types of ``args`` as ``dispatcher`` types them; None where one cannot be
    typed (numba's own path then reports it)."""
    try:
        return tuple(dispatcher.typeof_pyval(a) for a in args)
    except Exception:
        return None


def _origin(dispatcher: Kernel):
    """``(template, constants)`` of the specialised module ``dispatcher`` is defined in, or
    None (a kernel of one of vq's own modules)."""
    module = sys.modules.get(dispatcher.py_func.__module__)
    return getattr(module, "__vq_specialisation__", None)


def compile_types(dispatcher: Kernel, argtypes: tuple) -> None:
    """Compile ``dispatcher`` for ``argtypes`` (numba types) into the disk cache, unless it is
    there already (what the background compile server runs for each job)."""
    with _compiling_key(dispatcher, argtypes):
        inlining.install()
        dispatcher.compile(argtypes)


def _load_cached(dispatcher: Kernel, args: tuple):
    """The entry point of ``dispatcher``'s cached compilation for ``args``, now added to its
    overloads; None where there is none (or it cannot be loaded this way)."""
    cache = dispatcher._cache
    if not isinstance(cache, FunctionCache):
        return None
    argtypes = _argtypes(dispatcher, args)
    if argtypes is None:
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
    """How many compiled kernels this process has loaded from the cache (without numba's
    compiler); with :func:`compiles`, every kernel a process has made ready so far."""
    return _loaded[0]


# -- specialised modules ----------------------------------------------------------------------
def specialise(template: str, **constants) -> ModuleType:
    """The template module ``template`` (a dotted name) with ``constants`` in place of its
    marked block, as a module of its own whose kernels are disk-cached.

    Args:
        template: e.g. ``"vq.kernels.fastscan_flat_kernels"``; its source holds a block of
            ``NAME = value`` lines between ``# -- specialised constants`` and
            ``# -- end of specialised constants``.
        constants: a value (int, bool, float, str) for every name of that block.

    Returns:
        The module, the same object for the same arguments within a process.
    """
    for name, value in constants.items():
        if not isinstance(value, int | float | str | bool):
            raise TypeError(f"{name}: a specialised constant must be a plain value, got {value!r}")
    key = (template, tuple(sorted(constants.items())))
    with _lock:
        module = _specialised.get(key)
        if module is None:
            module = _specialised[key] = _load(template, constants)
    return module


def _source(template: str, constants: dict) -> str:
    spec = importlib.util.find_spec(template)
    if spec is None or spec.origin is None:
        raise ImportError(f"no kernel template module {template!r}")
    text = Path(spec.origin).read_text()
    begin, end = text.find(_BEGIN), text.find(_END)
    if begin < 0 or end < begin:
        raise ValueError(f"{template} has no '{_BEGIN}' ... '{_END}' block")
    head = text[: text.index("\n", begin) + 1]
    declared = {
        line.split("=")[0].strip()
        for line in text[len(head) : end].splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }
    if declared != set(constants):
        raise TypeError(
            f"{template} is specialised by {sorted(declared)}, got values for {sorted(constants)}"
        )
    body = "".join(f"{name} = {value!r}\n" for name, value in sorted(constants.items()))
    return head + body + text[end:]


def _holds(path: Path, source: str) -> bool:
    """Whether the file ``path`` holds exactly ``source`` (what is imported is what vq
    generated, whatever was written there since)."""
    try:
        return path.read_bytes() == source.encode()
    except FileNotFoundError:
        return False


def _load(template: str, constants: dict) -> ModuleType:
    source = _source(template, constants)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"_vq_specialised_{template.rsplit('.', 1)[-1]}_{digest}"
    path = None if _folder is None else _folder / "specialised" / f"{name}.py"
    if path is not None:
        try:  # written once (numba keys its cache on the file's stamp), again if it changed
            if not _holds(path, source):
                tmp = path.with_name(f"{name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(source)
                os.replace(tmp, path)
        except OSError:
            path = None
    origin = (template, tuple(sorted(constants.items())))  # (what a compile server asks for)
    if path is not None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module.__vq_specialisation__ = origin
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    filename = f"<vq specialised {template} {constants}>"  # in memory: no disk cache
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = ModuleType(name)
    module.__file__ = filename
    module.__vq_specialisation__ = origin
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


# -- compile events ---------------------------------------------------------------------------
class _Compiles(event.Listener):
    """Counts numba compilations (not cache loads) of vq's kernels; prints the pending
    announcement before the first."""

    def __init__(self):
        self.count = 0
        self.message: str | None = None

    def on_start(self, ev):
        func = getattr(ev.data.get("dispatcher"), "py_func", None)
        module = getattr(func, "__module__", "") or ""
        if not (module.startswith("vq.") or module.startswith("_vq_specialised_")):
            return
        self.count += 1
        if self.message is not None:
            print(self.message, file=sys.stderr, flush=True)
            self.message = None

    def on_end(self, ev):
        pass


_compiles = _Compiles()
event.register("numba:compile", _compiles)


def compiles() -> int:
    """How many times numba has compiled (rather than loaded from the cache) one of vq's
    kernels in this process: 0 for a process whose every kernel came from the cache."""
    return _compiles.count


@contextmanager
def announce(message: str) -> Iterator[None]:
    """Print ``message`` on stderr before the first kernel compilation inside, if any."""
    previous, _compiles.message = _compiles.message, message
    try:
        yield
    finally:
        _compiles.message = previous
