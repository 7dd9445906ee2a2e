"""Matched budgets for sweep.py --match: what each config must change to cost what the first costs.

    params  the MLP width (mlp_hidden) solved per variant so that its total parameters are within
            PARAMS_TOLERANCE of the reference's: total parameters are linear in mlp_hidden
            (c_fc and c_proj), so two builds on the meta device give the slope and one division
            the width
    flops   max_iters (and lr_decay_iters, in proportion) so that training FLOPs, flops_per_token
            (6N + attention as each variant computes it, causal pairs only: model.py) x tokens per
            iteration x iterations, equal the reference's. Not PaLM's count (flops_per_token_palm,
            for MFU), which bills dense softmax all T keys and so hands sparse and linear variants
            more steps than the work they save
    time    max_iters from a measured throughput probe (sweep.py runs it), so that every config
            gets the reference's wall-clock budget on this machine

Each function takes the keys of a config (trainer.settings.parse_keys) and returns override
strings for train.py; nothing here trains.
"""
import math

import torch

from model import GPT, GPTConfig
from trainer.settings import MODEL_KEYS

MATCHES = ("params", "flops", "time")
PARAMS_TOLERANCE = 0.01  # |params - reference| / reference after solving mlp_hidden
# What --match=flops counts, recorded in a sweep's plan.json: a sweep matched under PaLM's count (before
# this was recorded) is then refused rather than resumed with its old budgets.
FLOPS_COUNT = "as computed: causal pairs"


def parse_match(text):
    """'params,flops' -> ('params', 'flops'); ValueError naming the choices."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in MATCHES]
    if bad or not modes:
        raise ValueError(f"--match={text}: choose params, flops or time (params combines with one of the others, "
                         "e.g. --match=params,flops)")
    if "flops" in modes and "time" in modes:
        raise ValueError(f"--match={text}: flops and time both set max_iters; choose one of them")
    return modes


def meta_model(keys, vocab_size, **changes):
    """The model of a config's keys on the meta device (no memory, instant)."""
    config = GPTConfig(vocab_size=vocab_size, **{**{k: keys[k] for k in MODEL_KEYS}, **changes})
    with torch.device("meta"):
        return GPT(config)


def tokens_per_iter(keys):
    return keys["batch_size"] * keys["block_size"] * keys["gradient_accumulation_steps"]


def solve_mlp_hidden(keys, target_params, vocab_size):
    """The mlp_hidden that brings this config's parameters nearest target_params, and its count.
    ValueError when no width >= 1 comes within PARAMS_TOLERANCE, or when the config has no MLP."""
    if not keys.get("mlp", True):
        raise ValueError(f"attention={keys['attention']} with mlp=False has no MLP whose width --match=params "
                         "could solve; match flops or time instead")
    n1 = meta_model(keys, vocab_size, mlp_hidden=1).num_params()
    slope = meta_model(keys, vocab_size, mlp_hidden=2).num_params() - n1   # params per unit of width
    hidden = max(1, round(1 + (target_params - n1) / slope))
    params = n1 + slope * (hidden - 1)
    if abs(params - target_params) > PARAMS_TOLERANCE * target_params:
        raise ValueError(f"attention={keys['attention']}: even mlp_hidden={hidden} gives {params:,} parameters "
                         f"against the reference's {target_params:,}; its attention alone is larger, so "
                         "match something else or shrink the variant")
    return hidden, params


def iters_for(keys, ratio):
    """max_iters and lr_decay_iters scaled by ratio (the schedule keeps its shape), as overrides."""
    iters = max(1, round(keys["max_iters"] * ratio))
    decay = max(1, round(keys["lr_decay_iters"] * ratio))
    return [f"--max_iters={iters}", f"--lr_decay_iters={decay}"], iters


def flops_ratio(keys, ref_keys, vocab_size, hidden=None, ref_hidden=None):
    """Iterations of this config per iteration of the reference at equal training FLOPs."""
    def total(k, h):
        model = meta_model(k, vocab_size, **({"mlp_hidden": h} if h else {}))
        return model.flops_per_token() * tokens_per_iter(k)
    return total(ref_keys, ref_hidden) / total(keys, hidden)


def time_ratio(tokens_per_sec, ref_tokens_per_sec, keys, ref_keys):
    """Iterations of this config per iteration of the reference at equal wall time, from the probe."""
    s_per_iter = tokens_per_iter(keys) / tokens_per_sec
    ref_s_per_iter = tokens_per_iter(ref_keys) / ref_tokens_per_sec
    return ref_s_per_iter / s_per_iter


def lr_overrides(keys, lr):
    """learning_rate = lr with min_lr keeping its ratio to the config's learning_rate."""
    ratio = keys["min_lr"] / keys["learning_rate"] if keys["learning_rate"] else 0.1
    return [f"--learning_rate={lr:g}", f"--min_lr={lr * ratio:g}"]


def fraction_overrides(keys, fraction):
    """The budget cut to `fraction` of its iterations (schedule and warmup in proportion)."""
    iters = max(1, math.ceil(keys["max_iters"] * fraction))
    return [f"--max_iters={iters}", f"--lr_decay_iters={max(1, math.ceil(keys['lr_decay_iters'] * fraction))}",
            f"--warmup_iters={math.ceil(keys['warmup_iters'] * fraction)}"]
