"""``python -m vq.distributed build|search``: the torchrun program (:mod:`vq.apps.torchrun`)."""

import sys

from vq.apps.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
