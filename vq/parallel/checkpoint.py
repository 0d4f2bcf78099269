"""Checkpoints of long training loops, so that a job restarted after a worker died (``torchrun
--max-restarts``) resumes where it was and ends with the result of an uninterrupted run.

A loop's state after ``step`` iterations is what the rest of it depends on: the centroids, the
random generator's state and the objective so far. It is the same on every process, so the
process of rank 0 writes it (safetensors + JSON metadata, written to a temporary file and renamed
over the previous checkpoint, never pickled) and, on a restart, reads it and broadcasts it; with
several nodes put the checkpoints on a file system that rank 0 sees after a restart (a shared
one, or the node given ``--node_rank 0``).

A checkpoint records the loop's settings and a fingerprint of its training sample (per-column
sums): resuming from a checkpoint of other settings or other data is a ``ValueError``, never a
silent mix of two runs. A resume is logged (a warning of the ``vq.distributed`` logger, which
Python prints to stderr unless logging is configured otherwise).

Fault injection, for tests: with ``VQ_FAULT_ITERATION=i`` (and ``VQ_FAULT_RANK=r``, default 1)
in the environment, the process of rank r exits (status 75) right after iteration i of the
first training loop that gets that far — on the first attempt only (``TORCHELASTIC_RESTART_COUNT``
unset or 0), so that the restarted group runs through.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from vq._version import __version__
from vq.parallel.atomic import write_safetensors
from vq.parallel.collectives import broadcast_json
from vq.parallel.shards import Shards

FORMAT = "vq.training-checkpoint"
FORMAT_VERSION = 1
#: exit status of a process stopped by fault injection
FAULT_EXIT_STATUS = 75

_log = logging.getLogger("vq.distributed")
_DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float64, torch.uint8)}


@dataclass
class _Scope:
    directory: Path
    every: int
    calls: int = 0


_SCOPE: ContextVar[_Scope | None] = ContextVar("vq_checkpoint_scope", default=None)


@contextmanager
def checkpoints(directory: str | os.PathLike, every: int = 1) -> Iterator[Path]:
    """Checkpoint every training loop started inside the ``with`` block.

    Each :func:`vq.kmeans` / :func:`vq.lbg` call — also those inside a quantizer's ``fit`` or an
    index's ``train`` — gets its own file in ``directory``, named by the order of the calls
    (``0000-kmeans.safetensors``, ``0001-kmeans.safetensors``, …). Run the same program again
    after a failure: finished loops load their final state, the interrupted one resumes from its
    last checkpoint, and the result equals that of an uninterrupted run.

    Args:
        directory: where the checkpoints go (created if missing).
        every: checkpoint after every ``every`` iterations (and after the last one).

    Yields:
        ``directory`` as a Path.
    """
    if every < 1:
        raise ValueError(f"every must be >= 1 (iterations between checkpoints), got {every}")
    path = Path(directory)
    token = _SCOPE.set(_Scope(path, int(every)))
    try:
        yield path
    finally:
        _SCOPE.reset(token)


def checkpoint_path(
    kind: str, path: str | os.PathLike | None, every: int
) -> tuple[Path | None, int]:
    """The file (and period) of the next training loop: ``path`` when given, else the next name in
    the enclosing :func:`checkpoints` block, else None (no checkpoints)."""
    if path is not None:
        if every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {every}")
        return Path(path), every
    scope = _SCOPE.get()
    if scope is None:
        return None, every
    scope.calls += 1
    return scope.directory / f"{scope.calls - 1:04d}-{kind}.safetensors", scope.every


class TrainingRun:
    """The state of one Lloyd-style loop: objective so far, periodic checkpoints, resume.

    Args:
        kind: what trains ("kmeans", "lbg"), recorded in the checkpoint.
        config: the loop's settings (JSON-serialisable); a checkpoint of other settings is refused.
        train: the training sample (its fingerprint is recorded when checkpointing).
        total_steps: iterations of the whole loop (the last one is always checkpointed).
        gen: the loop's random generator (saved and restored with the rest).
        path: checkpoint file, or None for no checkpoints.
        every: checkpoint after every ``every`` iterations.
    """

    def __init__(
        self,
        kind: str,
        config: dict[str, Any],
        train: Shards,
        total_steps: int,
        gen: torch.Generator,
        path: Path | None = None,
        every: int = 1,
    ):
        self.kind, self.config, self.train = kind, config, train
        self.total_steps, self.gen, self.path, self.every = total_steps, gen, path, every
        self.objective: list[float] = []
        self.centroids: torch.Tensor | None = None
        self._fingerprint = _fingerprint(train) if path is not None else None
        self._fault = _fault_iteration(train)

    @property
    def step(self) -> int:
        """Iterations done (restored ones included)."""
        return len(self.objective)

    def restore(self) -> torch.Tensor | None:
        """Load the last checkpoint, if any: sets the generator state and the objective so far and
        returns the centroids (None when there is nothing to resume). Collective: rank 0 reads
        the file and broadcasts what it found.

        Raises:
            ValueError: on every process, when the file is unreadable or belongs to a run with
                other settings or other training data.
        """
        if self.path is None:
            return None
        header, tensors = None, {}
        if self.train.is_root:
            header, tensors = self._read()
        header, tensors = _broadcast_state(self.train, header, tensors)
        if header["status"] == "error":
            raise ValueError(header["message"])
        if header["status"] == "none":
            return None
        self.gen.set_state(tensors["generator"])
        self.objective = tensors["objective"].tolist()
        self.centroids = tensors["centroids"].to(self.train.local.device)
        if self.train.is_root:
            _log.warning(
                "vq: %s resumed from %s at iteration %d of %d",
                self.kind,
                self.path,
                self.step,
                self.total_steps,
            )
        return self.centroids

    def iteration_done(self, centroids: torch.Tensor, total: float) -> None:
        """Record one iteration (the centroids after its update and the objective of its
        assignment step); checkpoint when due."""
        self.objective.append(float(total))
        self.centroids = centroids
        step = self.step
        if self.path is not None and self.train.is_root:
            if step % self.every == 0 or step == self.total_steps:
                self._write()
        if step == self._fault:
            sys.stderr.write(
                f"vq: fault injection: rank {self.train.rank} exits after iteration {step} "
                "(VQ_FAULT_ITERATION)\n"
            )
            sys.stderr.flush()
            os._exit(FAULT_EXIT_STATUS)

    # -- files ----------------------------------------------------------------------------
    def _metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "vq_version": __version__,
            "kind": self.kind,
            "config": _config_json(self.config),
            "step": str(self.step),
        }

    def _write(self) -> None:
        assert self.path is not None and self.centroids is not None
        tensors = {
            "centroids": self.centroids.detach().float().cpu().contiguous(),
            "objective": torch.tensor(self.objective, dtype=torch.float64),
            "generator": self.gen.get_state(),
            "fingerprint": self._fingerprint,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors(self.path, tensors, self._metadata())

    def _read(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(header, tensors) of the checkpoint file as rank 0 finds it."""
        path = self.path
        assert path is not None
        if not path.exists():
            return {"status": "none"}, {}
        fix = f"delete {path} to start this training over, or checkpoint elsewhere"
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        except (SafetensorError, OSError, ValueError) as err:
            return _error(f"{path}: unreadable training checkpoint ({err}); {fix}"), {}
        if meta.get("format") != FORMAT:
            return _error(f"{path}: not a vq training checkpoint; {fix}"), {}
        if int(meta.get("format_version", "0")) > FORMAT_VERSION:
            return _error(f"{path}: written by a newer vq ({meta.get('vq_version')}); {fix}"), {}
        ours = _config_json(self.config)
        if meta.get("kind") != self.kind or meta.get("config") != ours:
            return _error(
                f"{path}: a checkpoint of another training ({meta.get('kind')} "
                f"{meta.get('config')}, this one is {self.kind} {ours}); {fix}"
            ), {}
        missing = {"centroids", "objective", "generator", "fingerprint"} - set(tensors)
        step = int(meta.get("step", "-1"))
        if missing or step != tensors.get("objective", torch.zeros(0)).numel():
            return _error(f"{path}: incomplete training checkpoint; {fix}"), {}
        if not _same_fingerprint(tensors["fingerprint"], self._fingerprint):
            return _error(
                f"{path}: a checkpoint of the same settings but other training data; {fix}"
            ), {}
        if not 0 <= step <= self.total_steps:
            return _error(
                f"{path}: checkpoint at iteration {step} of {self.total_steps}; {fix}"
            ), {}
        del tensors["fingerprint"]
        return {"status": "ok"}, tensors


def _config_json(config: dict[str, Any]) -> str:
    """The settings as canonical JSON (numpy scalars as plain numbers)."""
    return json.dumps(config, sort_keys=True, default=lambda v: v.item())


def _error(message: str) -> dict[str, Any]:
    return {"status": "error", "message": message}


def _fingerprint(train: Shards) -> torch.Tensor:
    """float64 [d + 2]: column sums, sum of absolute values and sum of squares of the (global)
    training sample, computed in chunks so that no float64 copy of the sample is made."""
    x = train.local.reshape(train.local.shape[0], -1)
    acc = torch.zeros(x.shape[1] + 2, dtype=torch.float64, device=x.device)
    for s in range(0, x.shape[0], 1 << 16):
        chunk = x[s : s + (1 << 16)].double()
        acc[:-2] += chunk.sum(dim=0)
        acc[-2] += chunk.abs().sum()
        acc[-1] += (chunk * chunk).sum()
    (acc,) = train.all_sum(acc)
    return acc.cpu()


def _same_fingerprint(saved: torch.Tensor, ours: torch.Tensor | None) -> bool:
    """Equal up to the rounding of sums taken in another order (another number of processes)."""
    if ours is None or saved.shape != ours.shape or saved.dtype != torch.float64:
        return False
    scale = float(ours[-2].abs()) + 1e-30
    return bool(((saved - ours).abs() <= 1e-9 * scale + 1e-7 * ours.abs()).all())


def _broadcast_state(
    train: Shards, header: dict | None, tensors: dict[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Rank 0's header and tensors on every process: the header travels as JSON with the
    tensors' names, dtypes and shapes, then each tensor (nothing is pickled)."""
    if not train.distributed:
        assert header is not None
        return header, tensors
    if train.is_root:
        assert header is not None
        shapes = {
            n: [str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in tensors.items()
        }
        header = {**header, "tensors": shapes}
    header = broadcast_json(train.group, header)
    out = {}
    for name, (dtype, shape) in sorted(header.pop("tensors").items()):
        t = tensors[name] if train.is_root else torch.zeros(shape, dtype=_DTYPES[dtype])
        out[name] = train.broadcast(t)
    return header, out


def _fault_iteration(train: Shards) -> int:
    """The iteration after which fault injection stops this process (-1: never)."""
    value = os.environ.get("VQ_FAULT_ITERATION")
    if not value or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return -1
    if train.rank != int(os.environ.get("VQ_FAULT_RANK", "1")):
        return -1
    return int(value)
