"""What the prepare scripts share on the command line: the parser, its output options, the progress bar."""
import argparse
import os

from .errors import InputError, fail


class Parser(argparse.ArgumentParser):
    """argparse with the scripts' docstring as help text and its own errors as one line with exit status 2."""

    def __init__(self, description):
        super().__init__(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message):
        fail(f"{message}; see {self.prog} --help")


def positive_int(text):
    """argparse type for counts such as --max_tokens=5e6 (scientific notation is handy here)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != int(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0")
    return int(value)


def default_num_proc():
    return max(1, min(8, os.cpu_count() or 1))


def add_output_args(ap, out_dir):
    """The options every prepare script shares: where to write, id width, processes."""
    ap.add_argument("--out_dir", default=out_dir, help="where to write train.bin, val.bin, meta.json")
    ap.add_argument("--dtype", default="auto", choices=("auto", "uint16", "uint32"),
                    help="token id width; auto = uint16 when the vocabulary fits")
    ap.add_argument("--num_proc", type=int, default=default_num_proc(),
                    help="tokenizing processes (default %(default)s)")
    ap.add_argument("--test_fraction", type=float, default=0.0,
                    help="also hold out this fraction as test.bin, after val (default 0: no test split)")


def check_num_proc(num_proc):
    if num_proc < 1:
        raise InputError(f"--num_proc={num_proc} must be at least 1")


def check_fractions(val_fraction, test_fraction):
    """val and test together take less than the whole text; test may be 0 (no test split)."""
    if not 0 <= test_fraction < 1:
        raise InputError(f"--test_fraction={test_fraction} must be in [0, 1) (e.g. 0.05; 0 = no test split)")
    if val_fraction is not None and not val_fraction + test_fraction < 1:
        raise InputError(f"--val_fraction={val_fraction} + --test_fraction={test_fraction} leave no training "
                         "text; lower them")


def test_share(val_fraction, test_fraction):
    """The share of the held-out tokens (drawn at val_fraction + test_fraction) that becomes test.bin."""
    return test_fraction / (val_fraction + test_fraction) if test_fraction else 0.0


def progress(total, unit, desc):
    """A tqdm bar on a terminal, plain lines every few percent off one (data/progress.py)."""
    from .progress import progress as make
    return make(total, unit, desc)
