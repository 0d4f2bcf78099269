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

Where the folder cannot be created or written, or numba is outside the releases vq was checked
against (:data:`vq.kernels.jit.numba_compat.NUMBA_RANGE`), kernels compile in memory in every
process, after one warning. Folders of other versions, CPUs or sources that no process has used for
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
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import llvmlite
import llvmlite.binding as llvm
import numba

from vq._version import __version__
from vq.kernels.jit import background, locks, numba_compat, trust

_BEGIN = "# -- specialised constants"
_END = "# -- end of specialised constants"
#: a kernel folder unused this long is deleted when another one is created
UNUSED_DAYS = 30
_DAY = 86400.0
_lock = threading.RLock()
_specialised: dict[tuple, ModuleType] = {}


def cpu_key() -> str:
    """The CPU's name and a hash of its feature flags, as numba compiles for them."""
    name = numba.config.CPU_NAME or llvm.get_host_cpu_name()
    features = numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
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


_folder: Path | None = _usable_folder() if numba_compat.SUPPORTED else None


def folder() -> Path | None:
    """Where the compiled kernels of this vq version and CPU are kept (None: in memory only)."""
    return _folder


def kernel(**options) -> Callable:
    """``numba.njit(**options)``, disk-cached in :func:`folder` (in memory where there is none,
    or where the function has no source file), loaded from the cache without numba's compiler
    (:class:`vq.kernels.jit.numba_compat.Kernel`)."""

    def decorate(func):
        cache = _folder is not None and os.path.isfile(func.__code__.co_filename)
        return numba_compat.njit(func, options, str(_folder) if cache else None)

    return decorate


def _first_call(dispatcher, args: tuple, compile_here: Callable):
    """What a kernel's call runs when the kernel holds no compilation for ``args``: the one in
    the disk cache; else, inside :func:`vq.kernels.jit.background.not_waiting`, a compile
    handed to the background server (the call raises
    :class:`~vq.kernels.jit.background.KernelNotReady`); else ``compile_here()`` (numba's
    compiler, in this process) under :func:`_compiling`'s lock."""
    argtypes = numba_compat.argtypes(dispatcher, args)
    entry = numba_compat.load_cached(dispatcher, argtypes)
    if entry is not None:
        return entry
    if not background.local.waiting and _folder is not None:  # (not_waiting(): hand over)
        if argtypes is not None and background.hand_over(dispatcher, argtypes, _origin(dispatcher)):
            name = dispatcher.py_func.__qualname__
            raise background.KernelNotReady(f"{name} is compiling in the background")
    if argtypes is not None:
        background.wait_for(dispatcher, argtypes)  # (asked for ahead: the server's to compile)
    with _compiling(dispatcher, argtypes):  # another process may have compiled it meanwhile
        entry = numba_compat.load_cached(dispatcher, argtypes)
        if entry is not None:
            return entry
        numba_compat.install_inliner()
        return compile_here()


numba_compat.Kernel.first_call = staticmethod(_first_call)


def prefetch(dispatcher, *args) -> bool:
    """Start compiling ``dispatcher`` for the types of ``args`` in the background server
    (:mod:`vq.kernels.jit.background`), for a step that will call it later while this process
    compiles something else now; nothing where the kernel is loaded or in the disk cache (it is
    loaded now), there is no disk cache, or background compiles are off. The later call waits
    on the signature's lock while the server compiles, then loads the server's result. Returns
    whether a compile was handed over."""
    if _folder is None or not background.enabled():
        return False
    argtypes = numba_compat.argtypes(dispatcher, args)
    if argtypes is None or numba_compat.load_cached(dispatcher, argtypes) is not None:
        return False
    return background.hand_over(dispatcher, argtypes, _origin(dispatcher), ahead=True)


@contextmanager
def _compiling(dispatcher, argtypes: tuple | None) -> Iterator[None]:
    """Held while this process compiles ``dispatcher`` for ``argtypes`` (numba types):
    :func:`vq.kernels.jit.locks.compiling`'s lock on the kernel's signature, none where there
    is no disk cache (or the types are unknown)."""
    if _folder is None or argtypes is None or not numba_compat.has_disk_cache(dispatcher):
        yield
        return
    func = dispatcher.py_func
    with locks.compiling(_folder, f"{func.__module__}.{func.__qualname__}{argtypes}"):
        yield


def _origin(dispatcher):
    """``(template, constants)`` of the specialised module ``dispatcher`` is defined in, or
    None (a kernel of one of vq's own modules)."""
    module = sys.modules.get(dispatcher.py_func.__module__)
    return getattr(module, "__vq_specialisation__", None)


def compile_types(dispatcher, argtypes: tuple) -> None:
    """Compile ``dispatcher`` for ``argtypes`` (numba types) into the disk cache, unless it is
    there already (what the background compile server runs for each job)."""
    with _compiling(dispatcher, argtypes):
        numba_compat.compile_types(dispatcher, argtypes)


def loads() -> int:
    """How many compiled kernels this process has loaded from the cache (without numba's
    compiler); with :func:`compiles`, every kernel a process has made ready so far."""
    return numba_compat.loads()


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
class _Compiles:
    """Counts numba compilations (not cache loads) of vq's kernels; prints the pending
    announcement before the first."""

    def __init__(self):
        self.count = 0
        self.message: str | None = None

    def __call__(self, dispatcher) -> None:
        func = getattr(dispatcher, "py_func", None)
        module = getattr(func, "__module__", "") or ""
        if not (module.startswith("vq.") or module.startswith("_vq_specialised_")):
            return
        self.count += 1
        if self.message is not None:
            print(self.message, file=sys.stderr, flush=True)
            self.message = None


_compiles = _Compiles()
numba_compat.on_compile(_compiles)


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
