"""Loading indexes: :func:`load_index` reads what ``index.save`` wrote (the file itself:
:mod:`vq.index.fileformat`) and builds the index it describes.

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
from vq.index.base import Index
from vq.index.factory import from_config
from vq.index.fileformat import (
    check_config_checksum,
    map_tensors,
    read_config,
    read_metadata,
    read_tensors,
)

#: wrappers (PreTransform, Refine) nest at most this deep in a configuration
_MAX_NESTING = 8
#: elements per step of the NaN/Inf check
_FINITE_CHUNK = 1 << 20


def save_index(index: Index, path) -> None:
    """``index.save(path)`` (see :meth:`vq.index.Index.save`)."""
    index.save(path)


def load_index(
    path, device: str | torch.device = "cpu", *, mmap: bool = False, verify: bool | None = None
) -> Index:
    """Read an index written by ``index.save(path)``.

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
            :mod:`vq.index.mapped`). Other reads (Flat/PQ/HNSW searches, filtered masks,
            range search, ``reconstruct``, export) go through the mapping: only the pages they
            touch become resident. The mapping is advised random access (no read-ahead) and
            copy-on-write: the index never writes to the file; ``add``, ``remove_ids`` and
            ``merge_from`` copy the buffers they change into memory first. While mapped, the
            file must not be truncated or rewritten in place (``index.save`` writes a new file
            and renames it, which is safe): an IVF search then raises an OSError that says
            so, and a read through the mapping would fault.
        verify: check the tensors' checksum, which reads every byte (default: True, and
            False with ``mmap``, whose point is not to read everything; ``mmap=True,
            verify=True`` reads the whole file once at load, and its pages stay resident until
            the system needs the memory). The header, the configuration's checksum, every
            shape and byte range and the consistency of the stored data that searches index
            with — offsets, ids, code ranges — are checked either way (4-bit codes: the range
            check reads every code; 8-bit codes and float vectors need no pass).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a vq index, written in a format version this vq does not read (the
            message names the versions), truncated, inconsistent, or its checksums do not
            match (the file was modified or corrupted). Nothing else: no file makes this
            function execute code, crash, or allocate more than the file holds.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no index file at {path}")
    verify = not mmap if verify is None else bool(verify)
    meta = read_metadata(path)
    if mmap:
        tensors = map_tensors(path, meta, verify)
    elif not verify:
        raise ValueError("verify=False needs mmap=True: a load that reads the file checks it")
    else:
        tensors = read_tensors(path, meta)
    config = read_config(path, meta)
    _check_nesting(config, path)
    growing, dtypes = _check_shapes(config, tensors, path)
    check_config_checksum(path, meta)
    _check_finite({k: v for k, v in tensors.items() if verify or k not in growing}, path)
    index = _build(config, path)
    # the file's tensors (mapped, or read into memory of their own) become the buffers: no
    # second copy; one stored in another dtype is converted, as a copy into the buffer would
    tensors = {k: v.to(dtypes[k]) if k in dtypes else v for k, v in tensors.items()}
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
    return index.to(device).eval()


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
    the temporaries stay small beside the tensors)."""
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        flat = t.reshape(-1)
        if t.dtype == torch.float32 and kernels.all_finite(flat[None].numpy()):
            continue  # (one pass, no temporary)
        chunks = [flat[s : s + _FINITE_CHUNK] for s in range(0, flat.numel(), _FINITE_CHUNK)]
        if all(bool(torch.isfinite(c).all()) for c in chunks):
            continue
        bad = sum(int((~torch.isfinite(c)).sum()) for c in chunks)
        raise ValueError(
            f"{path}: corrupted vq index file (tensor {name!r} holds {bad} NaN/Inf values)"
        )


def _check_shapes(config: dict, tensors: dict[str, torch.Tensor], path: Path):
    """Build the configured index on the meta device (no memory) and compare its fixed-size
    tensors with the file's, so that a forged config (a huge nlist or dim) cannot make the
    real construction allocate more than the file holds. The buffers that grow with the data
    (each index's ``growing_buffers()``) may have any size here; ``check_consistent`` checks
    them once loaded. Returns their names, and the dtype of every tensor of the index."""
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
        if name in growing:
            continue
        found = tensors.get(name)
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
