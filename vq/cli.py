"""The ``vq`` console command.

    vq nsynth [options]     the main job: vq against faiss on NSynth embeddings
    vq validate [options]   quantizer and index checks against faiss on generated vectors

Every subcommand takes ``--help``. Errors in the input end with a one-line message and a
non-zero exit status.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["nsynth", "validate"], help="what to run")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "nsynth":
        from vq import nsynth

        return nsynth.main(rest, prog="vq nsynth")
    if command == "validate":
        from vq import validate

        return validate.main(rest)
    parser.parse_args([command])  # prints the usage error and exits 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
