# ruff: noqa: I001 -- vq first: it sets how OpenMP threads wait before torch loads libgomp
import vq  # noqa: F401
import os

# kernels compile where they are called, as the tests expect (a search on a cold cache would
# otherwise answer on its torch path while its kernels compile in the background, and a test
# comparing the two paths would compare the torch path with itself); children inherit it.
# tests/test_background_compile.py runs that mode in processes of its own.
os.environ["VQ_BACKGROUND_COMPILE"] = "0"
import numpy as np
import pytest
import torch

from vq.datasets import anisotropic_vectors, clustered_vectors


@pytest.fixture(scope="session")
def blobs() -> np.ndarray:
    """10k × 32 Gaussian blobs (shared, read-only)."""
    x = clustered_vectors(10_000, 32, n_clusters=100, seed=1)
    x.setflags(write=False)
    return x


@pytest.fixture(scope="session")
def aniso() -> np.ndarray:
    x = anisotropic_vectors(10_000, 32, decay=0.9, seed=2)
    x.setflags(write=False)
    return x


#: torch threads per test: one under pytest-xdist, whose workers (one per core) already fill
#: the cores (two each oversubscribed them: the warm suite took 328 s against 306 s), two in a
#: single process
TORCH_THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(TORCH_THREADS)
    yield


@pytest.fixture(scope="session", autouse=True)
def _faiss_one_thread():
    """faiss trains the small reference indexes of the tests on one OpenMP thread: with two,
    its many short parallel regions (OPQ, k-means) cost seconds on a busy 2-core machine."""
    try:
        import faiss
    except ImportError:
        yield
        return
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(previous)
