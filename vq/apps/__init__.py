"""The top layer: programs built on the library — the ``vq`` command (:mod:`vq.apps.cli`),
``vq build`` / ``vq search`` (:mod:`vq.apps.build_search`), the main job against faiss on NSynth
embeddings (:mod:`vq.apps.nsynth`), the quantizer and index checks against faiss
(:mod:`vq.apps.validate`), the kernel warm-up (:mod:`vq.apps.warmup`), ``vq export``
(:mod:`vq.apps.export`), the torchrun program that builds and searches sharded indexes
(:mod:`vq.apps.torchrun`, run as ``python -m vq.distributed``) and the plumbing they share
(:mod:`vq.apps.common`).

Two floors: every program's command line — options, help texts, the checks that need no data —
is in :mod:`vq.apps.arguments`, and its errors' reporting in :mod:`vq.apps.errors`, both built
from the standard library alone, so that ``vq --help`` and ``vq <command> --help`` answer without
importing torch; :mod:`vq.apps.cli` imports a program's module only once its arguments have
parsed. The program modules import the library at module level; nothing in the library imports
them. Optional heavy dependencies (faiss, torchaudio) are imported where a program needs them.
"""
