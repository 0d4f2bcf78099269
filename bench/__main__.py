"""Run every benchmark at its default size: ``python -m bench`` (or ``make bench``).

ann and fastscan run at n=200,000 synthetic vectors so that the whole run stays within about
twenty minutes on two cores; ``python -m bench.ann`` and ``python -m bench.fastscan`` alone
default to 1M (``--data nsynth`` for the NSynth embeddings, ~5 min on two cores for bench.ann,
most of it faiss's OPQ training). coldstart starts some seventy fresh processes (each paying
``import torch``) and compiles every kind once in an empty kernel cache: about 8 minutes on two
cores, the compiles about 3 of them (``python -m bench.coldstart --no-cold`` skips those).
The recall frontiers against faiss, hnswlib and ScaNN run on their own:
``python -m bench.frontier`` (real sentence embeddings; the first run embeds them, ~20 min).
"""

from bench import ann, coldstart, encode, fastscan, kmeans, latency, memory, pq_search

if __name__ == "__main__":
    for module, argv in (
        (kmeans, []),
        (encode, []),
        (pq_search, []),
        (ann, ["--n", "200000"]),
        (fastscan, ["--n", "200000"]),
        (memory, []),
        (coldstart, []),
        (latency, []),
    ):
        module.main(argv)
        print()
