"""What one parallel step of vq's thread pool costs at the floor of a search
(``python -m bench.pool``).

    python -m bench.pool [--threads 2] [--work 5 25 50 100 200 400] [--rounds 5]

For each amount of work (µs of one core), a numba body that spins through that much
arithmetic runs as one :func:`vq.kernels.common.threads.parallel_for` step over ``--threads``
threads and, alternately, on the calling thread alone. Reported per amount: the step's time,
the serial time, the ideal (serial / threads), the overhead (step - ideal) and the speed-up;
then, from 200 traced steps, the median µs after the call's start at which the calling
thread's slice and the last worker's slice begin, and the median µs from the last slice's end
to the call's return. Best of ``--rounds`` samples of at least 0.1 s each.

Prints a table; writes bench/results/pool.csv.
"""

from __future__ import annotations

import argparse
import threading
import time

import numba
import numpy as np

from bench.common import report


@numba.njit(nogil=True, cache=True)
def _busy(start: int, stop: int, x: np.ndarray, rounds: int) -> None:
    s = 0.0
    for i in range(start, stop):
        for j in range(rounds):
            s += x[(i * 7 + j) & 1023] * 1.0000001
    x[start & 1023] += s * 1e-30


def _best(call, rounds: int) -> float:
    call()
    best = float("inf")
    for _ in range(rounds):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.1:
            call()
            n += 1
        best = min(best, (time.perf_counter() - start) / n)
    return best


def _calibrate(x: np.ndarray, slices: int) -> float:
    """Seconds per (slice unit x round) of :func:`_busy`."""
    rounds = 20_000
    return _best(lambda: _busy(0, slices, x, rounds), 3) / (slices * rounds)


def _trace(parallel_for, x: np.ndarray, units: int, rounds: int, steps: int = 200):
    """Medians over ``steps`` traced steps: (caller's slice start, last worker's slice start,
    return after the last slice's end), µs after the call's start."""
    log: list[tuple[bool, float, float]] = []
    caller = threading.get_ident()

    def body(a: int, b: int) -> None:
        t0 = time.perf_counter()
        _busy(a, b, x, rounds)
        log.append((threading.get_ident() == caller, t0, time.perf_counter()))

    own, other, tail = [], [], []
    for _ in range(steps):
        log.clear()
        start = time.perf_counter()
        parallel_for(body, units)
        end = time.perf_counter()
        own += [t0 - start for mine, t0, _ in log if mine]
        workers = [t0 - start for mine, t0, _ in log if not mine]
        if workers:
            other.append(max(workers))
        tail.append(end - max(t1 for _, _, t1 in log))
    med = lambda v: float(np.median(v)) * 1e6 if v else float("nan")  # noqa: E731
    return med(own), med(other), med(tail)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=float, nargs="+", default=[5, 25, 50, 100, 200, 400],
                   help="µs of one core per step")  # fmt: skip
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or min(args.work) <= 0:
        p.error(f"--threads and --rounds must be at least 1 and each --work above 0, got "
                f"--threads {args.threads} --rounds {args.rounds} --work {args.work}")  # fmt: skip

    import vq
    from vq.kernels.common.threads import parallel_for

    vq.set_num_threads(args.threads)
    x = np.ones(1024)
    units = 64 * args.threads
    per_unit_round = _calibrate(x, units)
    rows = []
    for work in args.work:
        rounds = max(1, round(work * 1e-6 / (units * per_unit_round)))
        step = lambda r=rounds: parallel_for(_busy, units, x, r)  # noqa: E731
        alone = lambda r=rounds: _busy(0, units, x, r)  # noqa: E731
        step_s, serial_s = _best(step, 1), _best(alone, 1)
        for _ in range(args.rounds - 1):  # alternate: step, serial, step, serial, ...
            step_s, serial_s = min(step_s, _best(step, 1)), min(serial_s, _best(alone, 1))
        own, last, tail = _trace(parallel_for, x, units, rounds)
        ideal = serial_s / args.threads
        rows.append({
            "work µs": f"{work:g}",
            "step µs": round(step_s * 1e6, 1),
            "serial µs": round(serial_s * 1e6, 1),
            "ideal µs": round(ideal * 1e6, 1),
            "overhead µs": round((step_s - ideal) * 1e6, 1),
            "speed-up": round(serial_s / step_s, 2),
            "caller starts µs": round(own, 1),
            "last worker starts µs": round(last, 1),
            "returns after µs": round(tail, 1),
        })  # fmt: skip
    title = f"## vq's pool: one parallel_for step against one thread, {args.threads} threads"
    report("pool", title, args.threads, rows, list(rows[0]))
    return rows


if __name__ == "__main__":
    main()
