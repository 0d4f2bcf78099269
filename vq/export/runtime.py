"""``OnnxRunner``: an exported model in ONNX Runtime, fed batches of any size."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vq.export.base import require
from vq.export.padding import pad_batch
from vq.index.core.filters import IdFilter

_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}


class OnnxRunner:
    """Runs a model written by :func:`vq.export.to_onnx` with ONNX Runtime.

    Rows are sent in chunks of the model's static batch size, the last chunk padded with
    :func:`vq.export.pad_batch`, and the outputs trimmed back to the rows given, so any number
    of rows works with a fixed-shape model.

        >>> runner = OnnxRunner("ivfpq.onnx")
        >>> D, I = runner(queries)          # float32 [nq, k], int64 [nq, k]
        >>> D, I = runner(queries, allowed=ids)   # a model exported with filtered=True

    Args:
        model: path of the ``.onnx`` file.
        providers: ONNX Runtime execution providers (default ``["CPUExecutionProvider"]``).
        threads: intra-op threads (default: ONNX Runtime's choice).

    Attributes:
        path: the model file.
        session: the ``onnxruntime.InferenceSession``.
        batch_size: the model's static batch size (None for a dynamic batch axis).
        metadata: the model's metadata (``dim``, ``k``, ``nprobe``, ``vq_version``, …).
        id_space: a filtered search model's mask length (None for other models).
    """

    def __init__(
        self,
        model: str | os.PathLike,
        providers: list[str] | None = None,
        threads: int | None = None,
    ):
        require("vq.export.OnnxRunner", "onnxruntime")
        import onnxruntime as ort

        self.path = Path(model)
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(model), options, providers=providers or ["CPUExecutionProvider"]
        )
        spec, *extra = self.session.get_inputs()
        self.input_name, self.input_shape = spec.name, tuple(spec.shape)
        self.id_space = int(extra[0].shape[0]) if extra else None
        self.input_dtype = _ORT_DTYPES.get(spec.type)
        batch = spec.shape[0]
        self.batch_size = batch if isinstance(batch, int) else None
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)

    def __call__(self, x: Any, allowed: Any = None) -> Any:
        """Outputs for the rows of ``x`` ``[n, *input_shape[1:]]`` (numpy or torch).

        ``allowed`` (filtered search models only, and required there): the ids a search may
        return, as :class:`vq.IdFilter` takes them (a :class:`vq.IdFilter`, an id array, or
        a bool mask over the ids), for every row of ``x``.

        Returns:
            One array for a single-output model (codes, vectors), else a tuple (distances,
            ids); numpy for numpy input, CPU tensors for tensor input.
        """
        data = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        trailing = tuple(self.input_shape[1:])
        if data.ndim != len(self.input_shape) or data.shape[1:] != trailing:
            raise ValueError(
                f"{self.input_name}: expected shape [n, {', '.join(map(str, trailing))}], "
                f"got {list(data.shape)}"
            )
        if self.input_dtype is not None and np.issubdtype(self.input_dtype, np.integer):
            self._check_codes(data)
        if self.input_dtype is not None:
            data = np.ascontiguousarray(data, dtype=self.input_dtype)
        feed = self._mask_feed(allowed)
        if self.batch_size is None:
            chunks = [self.session.run(None, {self.input_name: data, **feed})] if len(data) else []
        else:
            chunks = []
            for start in range(0, len(data), self.batch_size):
                padded, n = pad_batch(data[start : start + self.batch_size], (self.batch_size,))
                outs = self.session.run(None, {self.input_name: padded, **feed})
                chunks.append([o[:n] for o in outs])
        if chunks:
            outputs = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
        else:  # no rows: empty outputs of the right trailing shape
            outputs = [
                np.zeros(
                    (0, *(d if isinstance(d, int) else 0 for d in o.shape[1:])),
                    _ORT_DTYPES.get(o.type, np.float32),
                )
                for o in self.session.get_outputs()
            ]
        if isinstance(x, torch.Tensor):
            outputs = [torch.from_numpy(o) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _mask_feed(self, allowed: Any) -> dict[str, np.ndarray]:
        """The ``allowed`` input of a filtered search model: bool [id_space]."""
        if self.id_space is None:
            if allowed is not None:
                raise ValueError(
                    f"{self.path.name} takes no filter; export the search with filtered=True "
                    "to pass allowed="
                )
            return {}
        if allowed is None:
            raise ValueError(
                f"{self.path.name} is a filtered search: pass allowed= (the ids it may return)"
            )
        allowed = allowed if isinstance(allowed, IdFilter) else IdFilter(allowed)
        mask = allowed.contains(np.arange(self.id_space, dtype=np.int64))
        return {"allowed": mask.view(bool)}

    def _check_codes(self, data: np.ndarray) -> None:
        """Integer codes within [0, codebook_size): a cast must not wrap them silently."""
        if not np.issubdtype(data.dtype, np.integer):
            raise TypeError(f"{self.input_name}: expected integer codes, got {data.dtype}")
        size = int(self.metadata.get("codebook_size", np.iinfo(self.input_dtype).max + 1))
        if data.size and (int(data.min()) < 0 or int(data.max()) >= size):
            raise ValueError(
                f"{self.input_name}: codes must lie in [0, {size}), got values in "
                f"[{int(data.min())}, {int(data.max())}]"
            )
