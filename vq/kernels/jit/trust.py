"""Which kernel cache folders vq trusts.

numba's cache files are pickles, and vq imports the specialised kernel sources it writes
there (:func:`vq.kernels.jit.cache.specialise`): whoever can write the cache runs code in every
process that uses it. So a cache is used only when nobody but its user can write it:

- the folders vq creates (``<cache>/vq`` and the kernel folder inside) are made mode 0700;
- the kernel folder and ``<cache>/vq`` must be owned by the user running vq and writable by
  no group or other user;
- the folder above ``<cache>/vq`` (``~/.cache``, ``$XDG_CACHE_HOME`` or ``$NUMBA_CACHE_DIR``)
  must be owned by the user or by root and writable by no one else, unless its sticky bit is
  set (as ``/tmp``'s is: others may then add entries beside ``vq``, but not replace it).

A cache that fails these checks is not read at all: kernels compile in memory, after one
warning that says why. A specialised source is compared with the source vq generates for it
before it is imported (a changed one is written again). An entry numba cannot read (a
truncated or foreign file) is a miss: the kernel compiles again and its entry is rewritten.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: mode of the folders vq creates in the cache
PRIVATE = 0o700


def problem(path: Path, *, parent_may_be_shared: bool = False) -> str | None:
    """Why ``path`` (an existing folder) cannot hold trusted kernels, in words, or None.

    Args:
        path: the folder.
        parent_may_be_shared: the rule of the folder above vq's own (owned by the user or
            root; writable by others only with its sticky bit set).
    """
    try:
        st = path.stat()
    except OSError as err:
        return f"{path} cannot be read ({err.strerror or err})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is None:  # (no owners to compare on this platform)
        return None
    owners = (uid, 0) if parent_may_be_shared else (uid,)
    if st.st_uid not in owners:
        return f"{path} belongs to another user (uid {st.st_uid})"
    shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and not (parent_may_be_shared and st.st_mode & stat.S_ISVTX):
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make_private(path: Path) -> None:
    """Create the folder ``path`` with mode 0700 (whatever the umask; its missing parents as
    the umask says), unless it exists: an existing folder is checked as it is (one that was
    writable by others may hold anything by now), never changed. OSError where it cannot be."""
    try:
        path.mkdir(mode=PRIVATE, parents=True)
    except FileExistsError:
        return
    os.chmod(path, PRIVATE)


def private_folder(root: Path, folder: Path) -> str | None:
    """Create the kernel folder ``folder`` (and ``folder/specialised``) inside vq's cache
    ``root``, each 0700, and say why it cannot be trusted (the module docstring's rules), or
    None. Nothing is created under a parent of ``root`` that fails them. OSError where a
    folder cannot be created."""
    root.parent.mkdir(parents=True, exist_ok=True)
    reason = problem(root.parent, parent_may_be_shared=True)
    if reason is not None:
        return reason
    for path in (root, folder, folder / "specialised"):
        make_private(path)
        reason = problem(path)
        if reason is not None:
            return reason
    return None
