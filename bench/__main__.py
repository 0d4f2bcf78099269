"""Run every benchmark at its default size: ``python -m bench`` (or ``make bench``).

ann runs at n=200,000 synthetic vectors so that the whole run stays within about a quarter of an
hour on two cores; ``python -m bench.ann`` alone defaults to 1M (``--data nsynth`` for the NSynth
embeddings, ~5 min on two cores, most of it faiss's OPQ training).
"""

from bench import ann, encode, kmeans, memory, pq_search

if __name__ == "__main__":
    for module, argv in (
        (kmeans, []),
        (encode, []),
        (pq_search, []),
        (ann, ["--n", "200000"]),
        (memory, []),
    ):
        module.main(argv)
        print()
