"""How vq's command lines end on bad input: one line ``error: <what is wrong and what to do>``
on stderr and exit status 2, never a traceback.

    status = run_command(build, args)    # build(args)'s status, or 2 after one error line

Light on purpose (nothing but the standard library), so that a command can report a bad
argument before it imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class InputError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""


#: the errors a command reports as bad input (one line, exit status 2) rather than a traceback:
#: its own checks, the library's (ValueError, TypeError, RuntimeError), the system's (OSError:
#: a missing, unreadable or unwritable file, a directory given as a file) and running out of
#: memory
INPUT_ERRORS = (InputError, ValueError, TypeError, RuntimeError, OSError, MemoryError)


def describe(err: BaseException) -> str:
    """One line saying what ``err`` is: its message's first line; for an OSError the file and
    the system's reason ("/proc/x.vq: No such file or directory"); for a MemoryError, that
    memory ran out."""
    if isinstance(err, InputError):
        text = str(err)
    elif isinstance(err, OSError) and err.strerror and err.filename is not None:
        text = f"{err.filename}: {err.strerror}"
    elif isinstance(err, MemoryError):
        text = "out of memory" + (f" ({err})" if str(err) else "")
        text += "; ask for less (fewer vectors, a smaller -k or --train-size)"
    else:
        text = str(err) or type(err).__name__
    lines = text.strip().splitlines()
    return lines[0] if lines else type(err).__name__


def report_error(err: BaseException) -> int:
    """Print ``error: <describe(err)>`` on stderr; returns the exit status, 2."""
    print(f"error: {describe(err)}", file=sys.stderr)
    return 2


def run_command(command: Callable[[Any], int], args: Any) -> int:
    """``command(args)``'s exit status; 2 after :func:`report_error` when it raises one of
    :data:`INPUT_ERRORS`; 130 after one line when interrupted (Ctrl-C). argparse's own exits
    (``--help``, usage errors) pass through as SystemExit."""
    try:
        return command(args)
    except INPUT_ERRORS as err:
        return report_error(err)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
