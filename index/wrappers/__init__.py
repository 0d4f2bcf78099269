"""Indexes around another: a learned linear map in front (PreTransform), exact re-ranking behind
(Refine)."""
