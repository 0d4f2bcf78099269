"""The registry of index kinds: each kind registers itself once, at the end of its own module,
and everything that must know every kind reads it — :func:`vq.index_factory` (the description
each kind reads), :func:`vq.load_index` (the class a saved configuration names),
:func:`vq.index.from_faiss` (the faiss classes each kind converts), :mod:`vq.export` (which
kinds have a search graph) and the tests that run one behaviour over every kind.

    register(FlatIndex, example="Flat", factory=r"Flat", syntax="Flat",
             build=lambda match, dim, metric: FlatIndex(dim, metric), faiss=("IndexFlat",))

The registry sits below the kinds (it imports none of them): a kind is known once its module
is imported, which ``vq.index`` does for every kind it ships; a kind defined elsewhere (a test's,
a user's) registers the same way. Registering is not needed to use a kind directly; it is what
makes the factory, the loader and the converters build it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: ``build(match, dim, metric)`` of a factory description: the untrained index
Builder = Callable[[re.Match, int, str], Any]
#: ``from_config(args, build)``: the index of a saved configuration (``args`` without its
#: "class"); ``build`` builds a nested configuration (a wrapper's inner index)
ConfigReader = Callable[[dict, Callable[[dict], Any]], Any]


class FactoryRefusal(ValueError):
    """A description a kind's pattern matched but whose numbers it refuses (the factory adds
    the description and what it supports)."""


@dataclass(frozen=True)
class Kind:
    """One registered kind.

    Attributes:
        cls: the :class:`vq.index.Index` subclass; ``cls.__name__`` is the name saved files
            give (``{"class": "IVFPQ", ...}``).
        example: a small factory description of the kind (vectors of at least 32 dimensions,
            a multiple of 8), what the docs and the tests that cover every kind build.
        factory: the description this kind reads, matched whole against the index part of a
            factory string (after the prefixes and transforms, before a re-ranking), or None
            (a wrapper: the factory reads those itself).
        build: ``build(match, dim, metric)``, the untrained index of a matched description.
        syntax: what ``factory`` reads, in the factory's error message.
        family: a pattern of the first part alone (``IVF1024``), for the factory's "unknown
            encoding after ..." message, or None.
        faiss: the faiss classes (names in the ``faiss`` module) that ``cls.from_faiss(findex,
            metric)`` converts (:func:`vq.index.from_faiss`).
        from_config: the index of a saved configuration (default ``cls(**args)``).
        wrapper: an index around another one (PreTransform, Refine).
    """

    cls: type
    example: str
    factory: re.Pattern | None = None
    build: Builder | None = None
    syntax: str = ""
    family: re.Pattern | None = None
    faiss: tuple[str, ...] = ()
    from_config: ConfigReader | None = None
    wrapper: bool = False

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def exports(self) -> bool:
        """Whether the kind has a static-shape search (``searcher()``: its torch engine and
        what :mod:`vq.export` writes out); a wrapper's depends on the index it wraps."""
        return self.cls.has_own_searcher()

    def config_index(self, args: dict, build: Callable[[dict], Any]):
        """The untrained index of a saved configuration's arguments."""
        if self.from_config is not None:
            return self.from_config(args, build)
        return self.cls(**args)


_KINDS: dict[str, Kind] = {}


def register(
    cls: type,
    *,
    example: str,
    factory: str | None = None,
    build: Builder | None = None,
    syntax: str = "",
    family: str | None = None,
    faiss: tuple[str, ...] = (),
    from_config: ConfigReader | None = None,
    wrapper: bool = False,
) -> type:
    """Make ``cls`` known to the factory, the loader, the faiss converters and export (see
    :class:`Kind` for the arguments; ``factory`` and ``family`` are regular expressions, ASCII
    digits only). Registering a class again replaces its entry; another class under a
    registered name is a ValueError. Returns ``cls``."""
    known = _KINDS.get(cls.__name__)
    if known is not None and known.cls is not cls:
        raise ValueError(
            f"an index kind named {cls.__name__!r} is registered already ({known.cls.__module__})"
        )
    if (factory is None) != (build is None):
        raise ValueError("register: give factory and build together, or neither")
    _KINDS[cls.__name__] = Kind(
        cls,
        example,
        None if factory is None else re.compile(factory, re.ASCII),
        build,
        syntax,
        None if family is None else re.compile(family, re.ASCII),
        tuple(faiss),
        from_config,
        wrapper,
    )
    return cls


def kinds() -> tuple[Kind, ...]:
    """Every registered kind, in the order they registered."""
    return tuple(_KINDS.values())


def kind(name: str) -> Kind | None:
    """The kind registered under the class name ``name``, or None."""
    return _KINDS.get(name) if isinstance(name, str) else None
