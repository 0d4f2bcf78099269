"""The main job: validate vq against faiss on generated vectors.

    vq validate [--n 50000] [--dim 64] [--threads 2]      (or python -m vq.apps.validate)

What "validated against faiss" means here (the options: :func:`vq.apps.arguments.validate`):
1. same codebooks ⇒ same codes: faiss-trained codebooks copied into vq (and vq's into faiss)
   give identical codes, ties aside, and equal reconstructions;
2. trained independently ⇒ same quality: k-means objective and PQ/OPQ reconstruction error
   within 1% of faiss, RVQ within 2%, IVFPQ recall@10 within 0.01 (one training seed here;
   the tests average three);
3. speed side by side, same data and thread count, reported as a ratio (indicative here; the
   careful alternating measurements live in ``bench/``).

Prints one table and exits non-zero if any check fails. :mod:`vq.apps.nsynth` runs the same
checks on NSynth embeddings (:func:`checks_on`).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

import vq
from vq import faiss_interop as fi
from vq.apps.arguments import parse
from vq.apps.common import faiss_available, run_command, set_threads
from vq.datasets import anisotropic_vectors, clustered_vectors, recall_at


@dataclass
class Check:
    name: str
    ours: float
    faiss: float
    target: str
    passed: bool | None  # None: reported, not judged (timings)


def _timed(fn, repeats: int = 3):
    """Result of ``fn`` and its best wall time over ``repeats`` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def _mse(x, x_hat) -> float:
    return float(((np.asarray(x, np.float64) - np.asarray(x_hat, np.float64)) ** 2).sum(1).mean())


def _same_codes(ours, ref, err_ours, err_ref) -> tuple[float, bool]:
    """Fraction of identical codes; differences must be exact ties in reconstruction error."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    differ = (ours != ref).any(axis=-1) if ours.ndim > 1 else ours != ref
    ties = np.allclose(err_ours[differ], err_ref[differ], rtol=1e-5, atol=1e-6)
    return 1.0 - float(differ.mean()), bool(ties and differ.mean() < 1e-3)


def _errors(x, x_hat):
    return ((np.asarray(x, np.float64) - np.asarray(x_hat, np.float64)) ** 2).sum(1)


def run_checks(n: int, dim: int, threads: int, seed: int = 0) -> list[Check]:
    """Every check on generated data: blobs, and anisotropic vectors (for OPQ and IVFPQ)."""
    x = clustered_vectors(n, dim, n_clusters=512, seed=seed)
    xa = anisotropic_vectors(n, dim, seed=seed + 1)
    q = anisotropic_vectors(1000, dim, seed=seed + 1 + 10**6)
    return checks_on(x, xa, q, threads)


def checks_on(
    x: np.ndarray, xa: np.ndarray, queries: np.ndarray, threads: int, nbits: int = 8
) -> list[Check]:
    """The checks on given vectors.

    Args:
        x: float32 [n, dim] for k-means, PQ and RVQ (dim a multiple of 8).
        xa: float32 [n', dim] for OPQ and the IVFPQ index (searched with ``queries``).
        queries: float32 [nq, dim].
        threads: for vq and faiss alike.
        nbits: bits per code (k-means with 2**nbits centroids, PQ/OPQ/RVQ/IVFPQ codes); lower
            it for small sets (about 10 vectors per centroid at least).
    """
    set_threads(threads, faiss=True)
    M = x.shape[1] // 8
    _warm_up(x, M)
    return [
        *_kmeans_checks(x, nbits),
        *_pq_checks(x, M, nbits),
        *_opq_checks(xa, M, nbits),
        *_rvq_checks(x, nbits),
        *_index_checks(xa, queries, M, nbits),
    ]


def _pq_name(M: int, nbits: int) -> str:
    return f"PQ{M}" + ("" if nbits == 8 else f"x{nbits}")


def _warm_up(x: np.ndarray, M: int) -> None:
    """numba compiles (or loads its cache) on first use: done here, so that timings compare
    work."""
    vq.kmeans(x[:2000], 16, niter=1)
    vq.ProductQuantizer(x.shape[1], M, nbits=4, niter=1).fit(x[:2000]).encode(x[:10])


def _kmeans_checks(x: np.ndarray, nbits: int) -> list[Check]:
    """k-means with 2**nbits centroids: objective within 1% of faiss.Kmeans, the same
    assignments from faiss's centroids, and the training times."""
    import faiss  # optional: imported where the checks need it

    dim, k = x.shape[1], 1 << nbits
    km = faiss.Kmeans(dim, k, niter=20, seed=1234)
    _, t_faiss = _timed(lambda: km.train(x))
    ours, t_ours = _timed(lambda: vq.kmeans(x, k, niter=20))
    ref_inertia = float(faiss_inertia(km, x))
    _, ref_assign = km.index.search(x, 1)
    vqz = fi.kmeans_index_from_centroids(km.centroids)
    same = float((vqz.encode(x) == ref_assign[:, 0]).mean())
    return [
        Check(
            f"k-means objective (k={k})",
            ours.inertia,
            ref_inertia,
            "<= 1.01x",
            ours.inertia <= 1.01 * ref_inertia,
        ),
        Check("k-means time (s)", t_ours, t_faiss, "(info)", None),
        Check("k-means assignment, faiss centroids", same, 1.0, "== 1", same == 1.0),
    ]


def _pq_checks(x: np.ndarray, M: int, nbits: int) -> list[Check]:
    """PQ: the same codebooks give the same codes in both directions (faiss's in vq, vq's in
    faiss), equal decodes; trained independently, MSE within 1%."""
    import faiss

    dim, pq_name = x.shape[1], _pq_name(M, nbits)
    checks = []
    fpq = faiss.ProductQuantizer(dim, M, nbits)
    fpq.train(x)
    pq = fi.pq_from_faiss(fpq)
    (codes, t_ours), (ref, t_faiss) = (
        _timed(lambda: pq.encode(x)),
        _timed(lambda: fpq.compute_codes(x)),
    )
    ref_codes = fi.unpack_codes(ref, M, nbits)
    frac, ok = _same_codes(
        codes, ref_codes, _errors(x, pq.decode(codes)), _errors(x, fpq.decode(ref))
    )
    checks.append(Check(f"{pq_name} codes, faiss codebooks", frac, 1.0, "== 1 (ties aside)", ok))
    dec = float(np.abs(pq.decode(ref_codes) - fpq.decode(ref)).max())
    checks.append(Check(f"{pq_name} decode, max abs difference", dec, 0.0, "<= 1e-5", dec <= 1e-5))
    checks.append(Check(f"{pq_name} encode time (s)", t_ours, t_faiss, "(info)", None))
    ours_pq = vq.ProductQuantizer(dim, M, nbits).fit(x)
    back = fi.pq_to_faiss(ours_pq)
    c1, c2 = ours_pq.encode(x), back.compute_codes(x)
    frac, ok = _same_codes(
        c1,
        fi.unpack_codes(c2, M, nbits),
        _errors(x, ours_pq.decode(c1)),
        _errors(x, back.decode(c2)),
    )
    checks.append(
        Check(f"{pq_name} codes, vq codebooks in faiss", frac, 1.0, "== 1 (ties aside)", ok)
    )
    mse_ours, mse_ref = _mse(x, ours_pq.decode(c1)), _mse(x, fpq.decode(ref))
    checks.append(
        Check(
            f"{pq_name} MSE, trained independently",
            mse_ours,
            mse_ref,
            "<= 1.01x",
            mse_ours <= 1.01 * mse_ref,
        )
    )
    return checks


def _opq_checks(xa: np.ndarray, M: int, nbits: int) -> list[Check]:
    """OPQ trained independently: MSE within 1% of faiss's OPQMatrix + PQ; an orthogonal
    rotation."""
    import faiss

    dim = xa.shape[1]
    opq_f = faiss.OPQMatrix(dim, M)
    opq_f.train(xa)
    ya = opq_f.apply(xa)
    pq_f = faiss.ProductQuantizer(dim, M, nbits)
    pq_f.train(ya)
    mse_ref = _mse(xa, opq_f.reverse_transform(pq_f.decode(pq_f.compute_codes(ya))))
    opq = vq.OPQ(dim, M, nbits).fit(xa)
    mse_ours = _mse(xa, opq.decode(opq.encode(xa)))
    r = opq.rotation.double()
    orth = float((r @ r.T - torch.eye(dim, dtype=torch.float64)).abs().max())
    return [
        Check(
            f"O{_pq_name(M, nbits)} MSE, trained independently",
            mse_ours,
            mse_ref,
            "<= 1.01x",
            mse_ours <= 1.01 * mse_ref,
        ),
        Check("OPQ rotation, max abs of RRᵀ - I", orth, 0.0, "<= 1e-4", orth <= 1e-4),
    ]


def _rvq_checks(x: np.ndarray, nbits: int) -> list[Check]:
    """RVQ of 4 stages: greedy parity with faiss's codebooks, then quality (MSE within 2%)
    at beam 1 and 4."""
    import faiss

    dim, checks = x.shape[1], []
    for beam in (1, 4):
        frq = faiss.ResidualQuantizer(dim, 4, nbits)
        frq.max_beam_size = beam
        frq.train(x[:20_000])
        ref = frq.compute_codes(x)
        if beam == 1:
            rq_f = fi.rvq_from_faiss(frq)
            codes = rq_f.encode(x)
            frac, ok = _same_codes(
                codes,
                fi.unpack_codes(ref, 4, nbits),
                _errors(x, rq_f.decode(codes)),
                _errors(x, frq.decode(ref)),
            )
            checks.append(
                Check(
                    f"RVQ 4x{nbits} greedy codes, faiss codebooks",
                    frac,
                    1.0,
                    "== 1 (ties aside)",
                    ok,
                )
            )
        rq = vq.ResidualVQ(dim, 4, 1 << nbits, beam_size=beam).fit(x[:20_000])
        mse_ours, mse_ref = _mse(x, rq.decode(rq.encode(x))), _mse(x, frq.decode(ref))
        checks.append(
            Check(
                f"RVQ 4x{nbits} beam {beam} MSE, trained independently",
                mse_ours,
                mse_ref,
                "<= 1.02x",
                mse_ours <= 1.02 * mse_ref,
            )
        )
    return checks


def _index_checks(x: np.ndarray, q: np.ndarray, M: int, nbits: int) -> list[Check]:
    """IVFPQ: faiss's trained index imported gives faiss's answers; trained on its own, vq's
    reaches faiss's recall@10."""
    import faiss

    from vq.kernels.jit import background

    dim, nprobe = x.shape[1], 8
    nlist = min(256, max(8, x.shape[0] // 64))
    exact = faiss.IndexFlatL2(dim)
    exact.add(x)
    truth = exact.search(q, 10)[1]
    ref = faiss.index_factory(dim, f"IVF{nlist},PQ{M}x{nbits}np")
    ref.train(x[:20_000])
    ref.add(x)
    ref.nprobe = nprobe
    (Df, If), t_faiss = _timed(lambda: ref.search(q, 10))
    imported = vq.index.from_faiss(ref)
    # the kernels compile here when they must (background.waiting): on a machine that has
    # compiled nothing, a search would answer on the torch path while they compile in the
    # background, and these checks (and the time) are of the kernels
    with background.waiting():
        (D, I), t_ours = _timed(lambda: imported.search(q, 10, nprobe=nprobe))
    same = ((I == If) | np.isclose(D, Df, rtol=1e-5)).all(axis=1).mean()
    # both sides expand ||q - c||² = ||q||² - 2⟨q, c⟩ + ||c||² in float32, whose rounding
    # error scales with ||q||², not with the distance: allow 1e-5 of it beyond 1e-4 relative
    slack = 1e-4 * np.abs(Df) + 1e-5 * (q.astype(np.float64) ** 2).sum(1, keepdims=True)
    close = bool((np.abs(D - Df) <= slack).all())
    name = f"IVF{nlist},PQ{M}" + ("" if nbits == 8 else f"x{nbits}")
    own = vq.IVFPQ(dim, nlist, M, nbits, nprobe=nprobe).train(x[:20_000])
    own.add(x)
    with background.waiting():
        r_ours, r_faiss = recall_at(own.search(q, 10)[1], truth, 10), recall_at(If, truth, 10)
    return [
        Check(
            f"{name} top-10, faiss index imported",
            float(same),
            1.0,
            ">= 0.999",
            same >= 0.999 and close,
        ),
        Check(f"{name} search time (s), nprobe {nprobe}", t_ours, t_faiss, "(info)", None),
        Check(
            f"{name} recall@10, trained independently",
            r_ours,
            r_faiss,
            ">= faiss - 0.01",
            r_ours >= r_faiss - 0.01,
        ),
    ]


def faiss_inertia(km, x) -> float:
    d, _ = km.index.search(x, 1)
    return float(d.astype(np.float64).sum())


def main(argv: list[str] | None = None, prog: str = "vq validate") -> int:
    """The checks with the command line ``argv`` (see :func:`vq.apps.arguments.validate`);
    returns the exit status: 0, 1 if a check fails, 2 for bad input."""
    return run_command(run, parse("validate", argv, prog))


def run(args: argparse.Namespace) -> int:
    """The checks, given their parsed arguments."""
    if not faiss_available():
        return 2
    print(
        f"# vq validated against faiss: {args.n} x {args.dim} blobs and anisotropic vectors, "
        f"{args.threads} threads\n"
    )
    checks = run_checks(args.n, args.dim, args.threads)
    return 1 if print_checks(checks) else 0


def print_checks(checks: list[Check]) -> list[str]:
    """Print the checks as a table and a summary line; returns the names of failed checks."""
    print("| check | vq | faiss | vq / faiss | target | result |")
    print("|---|---|---|---|---|---|")
    for c in checks:
        ratio = f"{c.ours / c.faiss:.3f}" if c.faiss else ""
        result = "-" if c.passed is None else "ok" if c.passed else "FAIL"
        print(f"| {c.name} | {c.ours:.6g} | {c.faiss:.6g} | {ratio} | {c.target} | {result} |")
    judged = [c for c in checks if c.passed is not None]
    failed = [c.name for c in judged if not c.passed]
    print(f"\n{len(judged) - len(failed)} passed, {len(failed)} failed")
    return failed


if __name__ == "__main__":
    sys.exit(main())
