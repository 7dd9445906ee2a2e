"""Training and evaluation batches: random windows of block_size tokens from the token files
that data/<dataset>/prepare.py writes (train.bin, val.bin), or, for a dataset of aligned examples
(meta.json "format": "examples", e.g. data/mqar), random whole rows of {split}.bin with their
targets from {split}.targets.bin (int32; -1 where a position does not count).

Randomness a resumed run must repeat is a function of (seed, rank, step) alone: training
batch n of rank r is drawn from a generator seeded by (seed, r, n), and so are the dropout
masks of each step. Resuming then reproduces the uninterrupted run on every rank with no
RNG state to save. Every evaluation reads the same windows, whatever the run's seed (EVAL_SEED), so
losses compare across evaluations and across runs: seeds of two configs are judged on one sample.
"""
import math
import os

import numpy as np
import torch

from trainer.cli import ConfigError

EVAL_SEED = 1_000_003  # the evaluation windows' draw: one set for every run, not per training seed


ID_SAMPLE = 1 << 20   # token ids read per split to check them against vocab_size (all of a small file)


def is_examples(meta) -> bool:
    return meta.get("format") == "examples"


def check_example_files(data_dir, meta, block_size):
    """A dataset of aligned examples: rows of block_size tokens, each with a targets file of the same
    count (and at least one row per split)."""
    row = meta.get("row_len")
    if row != block_size:
        raise ConfigError(f"{data_dir} holds examples of {row} tokens (meta.json row_len); set block_size={row}")
    for split in ("train", "val"):
        inputs, targets = os.path.join(data_dir, f"{split}.bin"), os.path.join(data_dir, f"{split}.targets.bin")
        if not os.path.isfile(targets):
            raise ConfigError(f"{targets} is missing (meta.json says format=examples); re-run the prepare script")
        n_in = os.path.getsize(inputs) // np.dtype(meta.get("dtype", "uint16")).itemsize
        n_out = os.path.getsize(targets) // np.dtype(meta.get("targets_dtype", "int32")).itemsize
        if n_in != n_out or n_in % row or n_in == 0:
            raise ConfigError(f"{inputs} ({n_in} tokens) and {targets} ({n_out}) are not whole rows of {row} of the "
                              "same examples; re-run the prepare script")


def check_token_files(data_dir, meta, block_size):
    """Both splits hold whole tokens of meta's dtype, more than block_size of them, and ids below
    vocab_size (all ids of a file up to ID_SAMPLE tokens, an evenly strided sample of a larger one:
    a few ms, so a meta.json that lies fails here and not mid-run)."""
    dtype = np.dtype(meta.get("dtype", "uint16"))
    if is_examples(meta):
        check_example_files(data_dir, meta, block_size)
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        size = os.path.getsize(path)
        if size % dtype.itemsize:
            raise ConfigError(f"{path} is {size} bytes, not a whole number of {dtype.name} tokens "
                              "(meta.json); re-run the prepare script")
        if size // dtype.itemsize <= block_size and not is_examples(meta):
            raise ConfigError(f"{path} holds {size // dtype.itemsize} tokens, not more than block_size={block_size}; "
                              "lower block_size")
        tokens = np.memmap(path, dtype=dtype, mode="r")
        top = int(tokens[::max(1, len(tokens) // ID_SAMPLE)].max())
        if top >= meta["vocab_size"]:
            raise ConfigError(f"{path} holds token id {top} but meta.json says vocab_size={meta['vocab_size']}; "
                              "re-run the prepare script (the two files are from different runs of it)")


class Batches:
    def __init__(self, data_dir, meta, block_size, batch_size, device, seed, rank=0):
        self.data_dir, self.block_size, self.batch_size = data_dir, block_size, batch_size
        self.np_dtype = np.dtype(meta.get("dtype", "uint16"))
        self.examples = is_examples(meta)
        self.targets_dtype = np.dtype(meta.get("targets_dtype", "int32"))
        self.device, self.seed, self.rank = device, seed, rank
        self.gen = torch.Generator()

    def rank_seed(self, stream, n):
        """stream 0: training batches, 1: dropout masks; n: batch or step number."""
        return (((self.seed * 1_000_003 + self.rank) * 2 + stream) * 1_000_003 + n) % 2**63

    def get(self, split, gen, load=True):
        """batch_size random windows drawn from gen; load=False only draws them (keeps gen in step)."""
        # re-opened each call: np.memmap keeps pages alive otherwise
        data = np.memmap(os.path.join(self.data_dir, f"{split}.bin"), dtype=self.np_dtype, mode="r")
        if self.examples:  # whole rows: row i starts at i * block_size
            ix = torch.randint(len(data) // self.block_size, (self.batch_size,), generator=gen) * self.block_size
            targets = np.memmap(os.path.join(self.data_dir, f"{split}.targets.bin"), dtype=self.targets_dtype, mode="r")
        else:
            ix = torch.randint(len(data) - self.block_size, (self.batch_size,), generator=gen)
            targets = None
        if not load:
            return None
        x = torch.stack([torch.from_numpy(data[i:i + self.block_size].astype(np.int64)) for i in ix])
        if targets is not None:
            y = torch.stack([torch.from_numpy(targets[i:i + self.block_size].astype(np.int64)) for i in ix])
        else:
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + self.block_size].astype(np.int64)) for i in ix])
        if self.device.startswith("cuda"):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def train(self, n):
        """Training batch n of this rank."""
        return self.get("train", self.gen.manual_seed(self.rank_seed(0, n)))

    def eval_windows(self, split, eval_iters, world=1):
        """(X, Y, weight) for this rank's share of the eval_iters fixed windows: rank r takes
        windows r, r + world, ... Every rank yields the same count (each forward may be a
        collective); a rank short of a window gets a dummy one with weight 0."""
        self.gen.manual_seed(EVAL_SEED)
        dummy = torch.zeros(self.batch_size, self.block_size, dtype=torch.long, device=self.device)
        for k in range(math.ceil(eval_iters / world) * world):
            real, mine = k < eval_iters, k % world == self.rank
            batch = self.get(split, self.gen, load=mine) if real else None  # every rank draws every window
            if mine:
                yield (*(batch if real else (dummy, dummy)), float(real))
