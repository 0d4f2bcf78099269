"""The one process-wide setting ``import vq`` makes: how long idle OpenMP threads spin.

torch runs its CPU operations (the matrix products of the coarse step, of Flat search and of
k-means) on OpenMP threads (libgomp), which spin after each parallel region before they
sleep; libgomp's default spin is about 300,000 rounds of ``pause``. vq's kernels run right
after such products on vq's own threads, which then wait for a core the spinning threads hold
(docs/perf/threads.md has the measured cost). ``GOMP_SPINCOUNT=10000`` keeps the threads awake
between the operations of one call and asleep between calls. libgomp reads it when it loads,
so it acts only when vq is imported before torch (and before faiss, which brings its own
libgomp); an explicit ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is left as it is.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"
