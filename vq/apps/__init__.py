"""The top layer: programs built on the library — the ``vq`` command (:mod:`vq.apps.cli`),
the main job against faiss on NSynth embeddings (:mod:`vq.apps.nsynth`), the quantizer and
index checks against faiss (:mod:`vq.apps.validate`), the kernel warm-up
(:mod:`vq.apps.warmup`), the torchrun program that builds and searches sharded indexes
(:mod:`vq.apps.torchrun`, run as ``python -m vq.distributed``), ``vq export``
(:mod:`vq.apps.export`) and the plumbing the command lines share (:mod:`vq.apps.common`).

Imports point down only: these modules import the library at module level, and nothing in the
library imports them. Optional heavy dependencies (faiss, torchaudio) are imported where a
program needs them, so that ``vq --help`` and the commands that do without them stay fast.
"""
