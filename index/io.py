"""Loading indexes: :func:`load_index` reads what ``index.save`` wrote (the file itself:
:mod:`vq.index.core.fileformat`) and builds the index it describes.

It sits at the top of the package, as it builds indexes of every kind (through
:func:`vq.index.factory.from_config`); nothing in the package imports it. Every check runs
before an index is built or filled: the file's format, version and checksums, then the sizes
(the configured index built on the meta device first, so that a forged configuration cannot
make the real construction allocate more than the file holds; each class names the buffers
that grow with the data, ``Index.growing_buffers``), then the consistency of the stored data
(each class checks its own, ``Index.consistency_problem``), so that no file makes a search
read out of bounds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vq import kernels
from vq.index.core.base import Index
from vq.index.core.fileformat import IndexFile, check_config_checksum, read_config
from vq.index.core.mapped import FileGuard, GuardedLock, file_range, read_chunks
from vq.index.factory import from_config

#: wrappers (PreTransform, Refine) nest at most this deep in a configuration
_MAX_NESTING = 8


def save_index(index: Index, path) -> None:
    """``index.save(path)`` (see :meth:`vq.index.Index.save`)."""
    index.save(path)


def load_index(
    path, device: str | torch.device = "cpu", *, mmap: bool = False, verify: bool | None = None
) -> Index:
    """Read an index written by ``index.save(path)``.

    The file is opened once: its header, its tensors and the mapping come from one descriptor,
    so a load while another process saves to the same path (``index.save`` writes a new file
    and renames it over the path) gives the version it opened, whole.

    Args:
        path: the file.
        device: where to put its buffers (search then runs there).
        mmap: map the stored data (codes, vectors, ids: tensors from 1 MiB; smaller ones are
            read) from the file instead of reading them (CPU), so an index larger than memory
            can be searched; results are those of an in-memory load. IVF searches read the
            lists they probe with ``pread`` into memory of their own, freed after the call
            (at most about 64 MiB of lists at a time), and the result ids likewise: none of
            the file's pages is mapped into the process, even from a warm page cache, where
            touching the mapping would map whole large folios around each page (see
            :mod:`vq.index.core.mapped`). Other reads (Flat/PQ/SQ/HNSW searches, filtered masks,
            range search, ``reconstruct``, export) go through the mapping: only the pages they
            touch become resident. The mapping is advised random access (no read-ahead) and
            copy-on-write: the index never writes to the file; ``add``, ``remove_ids`` and
            ``merge_from`` copy the buffers they change into memory first. While mapped, the
            file must not be truncated or written to in place (``index.save`` writes a new
            file and renames it, which is safe): every call on the index (search,
            range_search, reconstruct, save, add...) first checks the file (one ``fstat``)
            and raises an OSError that says so rather than read a page that is gone, which
            would kill the process (SIGBUS); a file cut short while a call is reading
            through the mapping still does.
        verify: check the tensors' checksum, which reads every byte (default: True, and
            False with ``mmap``, whose point is not to read everything; ``mmap=True,
            verify=True`` reads the whole file once at load, with ``pread``: none of its
            pages is mapped in). The header, the configuration's checksum, every shape,
            rank, dtype and byte range and the consistency of the stored data that searches
            index with — offsets, ids (int64, none below 0), code ranges — are checked either
            way (ids, fp16/bf16 codes (NaN/Inf) and 4-bit codes are read whole for it, mapped
            ones with ``pread`` but the 4-bit codes; 8-bit codes need no pass). Every float
            tensor is checked for NaN/Inf after its conversion to the dtype the index keeps
            (a float64 1e300 is inf as float32), mapped ones read with ``pread``, except the
            stored rows left mapped (vectors), which ``verify=True`` checks.

    Raises:
        FileNotFoundError: no such file (or not a regular file).
        ValueError: not a vq index, written in a format version this vq does not read (the
            message names the versions), truncated, inconsistent, or its checksums do not
            match (the file was modified or corrupted). Nothing else: no file makes this
            function execute code, crash, or allocate more than the file holds, and none
            makes the first search fail (every tensor has the dtype and rank its index
            expects).
    """
    path = Path(path)
    verify = not mmap if verify is None else bool(verify)
    if not mmap and not verify:
        raise ValueError("verify=False needs mmap=True: a load that reads the file checks it")
    with IndexFile(path) as file:  # (one descriptor: the version of the file it opened)
        meta = file.meta
        tensors = file.map_tensors(verify) if mmap else file.read_tensors()
    config = read_config(path, meta)
    _check_nesting(config, path)
    growing, dtypes = _check_shapes(config, tensors, path)
    check_config_checksum(path, meta)
    # the file's tensors (mapped, or read into memory of their own) become the buffers: no
    # second copy; one stored in another dtype is converted, as a copy into the buffer would
    tensors = {k: _converted(k, v, dtypes.get(k), config, path) for k, v in tensors.items()}
    # NaN/Inf: in what was read, the trained parameters (read with pread where mapped), all
    # with verify; the mapped rows (codes, vectors) are not read here
    unread = {k for k, v in tensors.items() if k in growing and file_range(v) is not None}
    _check_finite({k: v for k, v in tensors.items() if verify or k not in unread}, path)
    index = _filled(config, tensors, path)
    index = index.to(device).eval()
    _guard_mapped(index)
    return index


def _filled(config: dict, tensors: dict[str, torch.Tensor], path: Path) -> Index:
    """The index ``config`` describes, holding ``tensors`` (its buffers, as they are), checked
    for consistency; every failure a ValueError naming the file."""
    index = _build(config, path)
    try:
        index.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as err:
        raise ValueError(
            f"{path}: the tensors do not match a {config.get('class')}: {err}"
        ) from err
    try:
        index.check_consistent()
    except ValueError as err:
        raise ValueError(f"{path}: corrupted vq index file ({err})") from err
    except OSError as err:  # (a file cut short while its ids or codes were read)
        raise ValueError(f"{path}: truncated vq index file ({err})") from err
    return index


def _guard_mapped(index: Index) -> None:
    """Where buffers of ``index`` are mapped from its file, give each index of its tree a lock
    that checks the file before every call (:class:`vq.index.core.mapped.GuardedLock`)."""
    guard = FileGuard(index.modules())
    if guard.holds():
        for m in index.modules():
            if isinstance(m, Index):
                m.lock = GuardedLock(guard)


def _converted(name: str, t: torch.Tensor, dtype, config: dict, path: Path) -> torch.Tensor:
    """``t`` as ``dtype`` (the buffer's: None, or the same, leaves it as it is). A conversion
    to a wider dtype is refused (a file vq wrote has none, and it would allocate more than
    the file holds); a mapped tensor is read with ``pread`` (nothing of the mapping read)."""
    if dtype is None or t.dtype == dtype:
        return t
    if torch.empty(0, dtype=dtype).element_size() > t.element_size():
        raise ValueError(
            f"{path}: the tensors do not match a {config.get('class')}: {name!r} is stored as "
            f"{t.dtype}, which it keeps as {dtype} (wider: not a file vq wrote)"
        )
    out = torch.empty(t.shape, dtype=dtype)
    flat, at = out.view(-1), 0
    for chunk in read_chunks(t):
        flat[at : at + chunk.shape[0]] = chunk.to(dtype)
        at += chunk.shape[0]
    return out


def _build(config: dict, path: Path) -> Index:
    """``from_config(config)``, every failure a ValueError naming the file."""
    try:
        return from_config(config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    except (TypeError, KeyError, AttributeError, RuntimeError, OverflowError) as err:
        raise ValueError(f"{path}: invalid index configuration {config!r}: {err}") from err


def _check_nesting(config: dict, path: Path) -> None:
    depth, inner = 0, config
    while isinstance(inner, dict) and "index" in inner:
        depth, inner = depth + 1, inner["index"]
        if depth > _MAX_NESTING:
            raise ValueError(
                f"{path}: the configuration nests more than {_MAX_NESTING} indexes; "
                "not a file vq wrote"
            )


def _check_finite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """ValueError for a floating tensor holding NaN/Inf values (checked a chunk at a time:
    the temporaries stay small beside the tensors; a mapped one read with ``pread``)."""
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        if t.dtype == torch.float32 and file_range(t) is None:
            if kernels.all_finite(t.reshape(1, -1).numpy()):
                continue  # (one pass, no temporary)
        bad = sum(int((~torch.isfinite(c)).sum()) for c in read_chunks(t))
        if bad:
            raise ValueError(
                f"{path}: corrupted vq index file (tensor {name!r} holds {bad} NaN/Inf values)"
            )


def _check_shapes(config: dict, tensors: dict[str, torch.Tensor], path: Path):
    """Build the configured index on the meta device (no memory) and compare its fixed-size
    tensors with the file's, so that a forged config (a huge nlist or dim) cannot make the
    real construction allocate more than the file holds. The buffers that grow with the data
    (each index's ``growing_buffers()``) may have any number of rows here (``check_consistent``
    checks them once loaded), their other dimensions as configured (a 2-D ``ids`` is refused
    here, not by a kernel's typing at the first search). Returns their names, and the dtype of
    every tensor of the index."""
    with torch.device("meta"):
        index = _build(config, path)
    built = {"class": type(index).__name__, **index.config()}
    odd = _settings_not_taken(config, built)
    if odd:
        raise ValueError(
            f"{path}: the configuration holds settings a {config.get('class')} does not take: "
            f"{', '.join(odd)}"
        )
    growing = {
        f"{prefix}.{name}" if prefix else name
        for prefix, m in index.named_modules()
        if isinstance(m, Index)
        for name in m.growing_buffers()
    }
    for name, t in index.state_dict().items():
        found = tensors.get(name)
        if name in growing:  # any number of rows; the rest of the shape as configured
            if found is not None and (found.dim() != t.dim() or found.shape[1:] != t.shape[1:]):
                needs = ", ".join(["n", *map(str, t.shape[1:])]) + ("," if t.dim() == 1 else "")
                raise ValueError(
                    f"{path}: the tensors do not match a {config.get('class')}: {name!r} is of "
                    f"shape {tuple(found.shape)}, its configuration needs ({needs})"
                )
            continue
        if found is None or found.shape != t.shape:
            got = "missing" if found is None else f"of shape {tuple(found.shape)}"
            raise ValueError(
                f"{path}: the tensors do not match a {config.get('class')}: {name!r} is {got}, "
                f"its configuration needs {tuple(t.shape)}"
            )
    return growing, {name: t.dtype for name, t in index.state_dict().items()}


def _settings_not_taken(saved: dict, built: dict, where: str = "") -> list[str]:
    """Entries of a saved configuration that the index built from it does not hold as they are
    (unknown names, or values the constructor changed): a file vq wrote has none."""
    odd = []
    for key, value in saved.items():
        mine = built.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(mine, dict):
            odd += _settings_not_taken(value, mine, f"{where}{key}.")
        elif mine is _MISSING:
            odd.append(f"{where}{key} (unknown)")
        elif type(value) is not type(mine) or value != mine:
            odd.append(f"{where}{key}={value!r}")
    return odd


_MISSING = object()
