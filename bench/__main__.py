"""Run every benchmark at its default size: ``python -m bench`` (or ``make bench``)."""

from bench import encode, kmeans, pq_search

if __name__ == "__main__":
    for module in (kmeans, encode, pq_search):
        module.main([])
        print()
