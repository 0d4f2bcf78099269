"""Factory descriptions of every registered index kind (vq.index.core.registry), shared by the
tests that run one behaviour over all of them (io, filters, concurrency, bad input, export,
merge, retraining, overflow, filtered counts, cosine). A kind registered anywhere is in
``KINDS``: the toy kind of tests/toy_kind.py is, so these tests cover a kind the library does
not ship, without naming it."""

import toy_kind  # noqa: F401  (registers the toy kind)

from vq.index.core.registry import kinds

#: the example factory description of each registered kind, wrappers included, by class name
KINDS = {kind.name: kind.example for kind in kinds()}
#: the kinds with a static-shape search (what export writes out)
EXPORTED = {kind.name: kind.example for kind in kinds() if kind.exports}
#: more configurations of the same classes that store rows differently
VARIANTS = ["IVF16(soar),Flat", "IVF16,PQ8x4fs", "IVF16,Flat,RFlat"]
