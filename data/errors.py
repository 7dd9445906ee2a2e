"""The two kinds of failure a prepare script tells apart, and how they reach the user.

InputError is the user's to fix (one line, exit status 2, nothing left behind); SourceError is
a source that broke midway (a dropped connection), which a Hugging Face run resumes from.
"""
import sys


class InputError(Exception):
    """Bad input: reported as one line on stderr, exit status 2."""


class SourceError(Exception):
    """Reading the source failed midway (network, disk): the run can be resumed."""


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def one_line(exc, limit=300):
    """An exception as `Type: first line`, for one-line error messages."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
