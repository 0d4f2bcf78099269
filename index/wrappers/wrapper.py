"""Indexes around another one: :class:`vq.index.PreTransform` (a rotation in front) and
:class:`vq.index.Refine` (exact re-ranking behind). The wrapped index (``self.index``) holds the
search options; the wrapper forwards ``nprobe`` and adds the wrapped index's options to its own.
"""

from __future__ import annotations

from vq.index.core.base import Index


class Wrapper(Index):
    """An index around another one (``self.index``, set by the subclass), which holds the
    search options: ``nprobe`` reads and sets the wrapped index's, and ``search_options``
    adds the wrapped index's to this one's."""

    index: Index

    @property
    def nprobe(self) -> int:
        return self.index.nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.index.nprobe = value

    def effective_nprobe(self, nprobe: int | None) -> int:
        """The lists a search probes with the option ``nprobe`` (None: the index's), as the
        wrapped IVF index counts them."""
        return self.index.effective_nprobe(nprobe)

    def search_options(self) -> tuple[str, ...]:
        return tuple(sorted(set(super().search_options()) | set(self.index.search_options())))

    def has_searcher(self) -> bool:
        return self.index.has_searcher()  # (a static search around the wrapped index's)

    def probes_lists(self) -> bool:
        return self.index.probes_lists()
