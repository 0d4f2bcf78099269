"""Exact-distance scans: IVF-Flat lists, re-ranking candidates, Flat blocks, the lean path of a few
queries, sketches and range search."""
