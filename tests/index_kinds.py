"""Factory descriptions of every index kind, shared by the tests that run one behaviour over all
of them (merge, retraining, overflow, filtered counts, cosine)."""

#: a factory description of each class of the factory's registry, and of the wrappers
KINDS = {
    "FlatIndex": "Flat",
    "PQIndex": "PQ8",
    "SQIndex": "SQ8",
    "IVFFlat": "IVF16,Flat",
    "IVFPQ": "IVF16,PQ8",
    "IVFSQ": "IVF16,SQ8",
    "HNSW": "HNSW16",
    "HNSWSQ": "HNSW16,SQ8",
    "PreTransform": "PCA32,IVF16,Flat",
    "Refine": "HNSW16,RFlat",
}
#: more configurations of the same classes that store rows differently
VARIANTS = ["IVF16(soar),Flat", "IVF16,PQ8x4fs", "IVF16,Flat,RFlat"]
