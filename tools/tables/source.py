"""What the table generators share: a study's stored results, the models of its configs on the meta
device, and the cells every generated table writes the same way.

A study's files live in docs/results/<study>/ under the docs root (the repo, or a copy in a test).
Runs whose folders were kept are read through trainer.rundir.Run; studies whose runs were not kept
have table.json: the numbers the docs stated, with "source" saying where they came from. Configs
are read from this checkout (the code is what the parameter and cache columns describe).
"""
import functools
import json
import os

import torch

from attention.cache import StateCache
from tools import budget, compare, stats
from trainer.settings import parse_keys

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
CACHE_BYTES = torch.bfloat16.itemsize     # the docs' one convention for a K/V cache: bf16
STATE_BYTES = StateCache.dtype.itemsize   # a constant decoding state: fp32, as the model keeps it
CACHE_UNIT = "bf16"


def results_dir(root, study):
    return os.path.join(root, "docs", "results", study)


def study(root, name):
    """docs/results/<name>/table.json."""
    with open(os.path.join(results_dir(root, name), "table.json")) as f:
        return json.load(f)


@functools.cache
def keys_of(config, overrides=()):
    """Every train and model key of a config file (relative to the repo root) with overrides."""
    return parse_keys([os.path.join(HERE, config), *overrides])


@functools.cache
def model_of(config, overrides=(), vocab_size=65):
    """The config's model on the meta device (no memory, instant)."""
    return budget.meta_model(keys_of(config, tuple(overrides)), vocab_size)


def cache_bytes(model, context=None):
    """K/V cache bytes per token in bf16, all layers (averaged over `context` tokens when given: a
    window's cache stops growing)."""
    if context is None:
        return model.cache_elems_per_token() * CACHE_BYTES
    return model.cache_elems_per_seq(context) * CACHE_BYTES / context


def state_bytes(model):
    return model.cache_state_elems() * STATE_BYTES


def md_table(head, rows):
    """A markdown table: the header, its rule, one line per row (cells as text, an empty one as '| |')."""
    def line(cells):
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"
    return [line(head), "|" + "---|" * len(head)] + [line(row) for row in rows]


def delta(d, digits=4):
    """'+0.038 [+0.016, +0.061]' of a stored {"mean", "ci95"}; '(reference)' for None."""
    return "(reference)" if d is None else stats.fmt_delta(d["mean"], d["ci95"], digits)


def verdict(d):
    """'undetermined (Holm p 0.08)' of a stored {"verdict", "note"}; '' for None."""
    return "" if d is None else d["verdict"] + (f" ({d['note']})" if d.get("note") else "")


def mean_sd(pair, spec=".4f"):
    """'1.8368 ± 0.0123' of a stored [mean, sd] (tools.compare's cell)."""
    return compare.fmt_ms((pair[0], pair[1], None), spec)


def fmt_sci(x, digits=0):
    """0.0003 -> '3e-4' (a learning rate), 2.1e-06 -> '2.1e-6' with digits=1: no padded exponent."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"
