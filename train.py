"""Train a GPT with the attention of your choice.

    python train.py config/gqa.py                       # a config file, then overrides
    python train.py config/gqa.py --batch_size=32 --device=cpu
    python train.py --help                              # every key, its type, default and meaning
    torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt2_124m.py   # DDP
    torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt2_124m.py --strategy=fsdp

Writes to out_dir at every evaluation: ckpt.pt (to resume), best.pt (the weights of the best
validation loss), a line of log.jsonl and summary.json ("finished": false until the end).
init_from=resume continues from out_dir/ckpt.pt; init_from=RUN_DIR fine-tunes another run's
weights (e.g. at a longer block_size with --rope_scaling=yarn --rope_factor=4). A lock file
keeps a second run out of the same out_dir. Exit status: 0 done, 2 bad input or checkpoint,
3 non-finite loss (the last good checkpoint kept), 129/130/143 stopped by SIGHUP/SIGINT/SIGTERM
after saving.
"""
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from attention import check_impl_runs_on, variant_class
from configurator import ConfigError, fail
from model import GPT, GPTConfig
from pretrained import OVERRIDABLE, from_pretrained, overrides_from_keys, pretrained_config
from trainer.batches import Batches, check_token_files
from trainer.checkpoint import (
    CheckpointError,
    WriteError,
    is_run_folder,
    load_checkpoint,
    model_config_from_checkpoint,
    model_from_checkpoint,
    remove_stale_tmp,
    save_atomic,
)
from trainer.rundir import append_log, open_log, write_summary
from trainer.runfiles import (
    BadStepWatch,
    NonFinite,
    RunLock,
    StopSignals,
    all_ranks_max,
    peak_memory_bytes,
)
from trainer.settings import (
    FINETUNE_MAY_CHANGE,
    MODEL_KEYS,
    RESUME_MAY_CHANGE,
    TRAIN_KEYS,
    TrainConfig,
    check_data,
    check_fits_in_memory,
    check_train_values,
    check_wandb_ready,
    dataset_identity,
    parse_keys,
    resolve_device,
    resolve_dtype,
    train_help,
)
from trainer.threads import use_cpu_threads

RESUME_KEYS = ("model", "optimizer", "model_args", "iter_num", "best_val_loss")


# ---- settings: everything checked before any work ----
def load_settings(argv):
    """-> (TrainConfig, GPTConfig, meta, flat config, checkpoint or None). ConfigError on bad input.
    The checkpoint is the one the model starts from, read once: with init_from=resume its weights,
    optimizer and progress; with init_from=RUN_DIR (a fine-tune) only its weights are used."""
    explicit = set()
    cfg = parse_keys(argv, explicit)
    tc = TrainConfig(**{k: cfg[k] for k in TRAIN_KEYS})
    check_train_values(tc)
    world = int(os.environ.get("WORLD_SIZE", 1)) if "RANK" in os.environ else 1  # torchrun sets both
    if tc.gradient_accumulation_steps % world:
        raise ConfigError(f"gradient_accumulation_steps={tc.gradient_accumulation_steps} (the total over all ranks) "
                          f"must be a multiple of the {world} ranks")
    model_cfg = {k: cfg[k] for k in MODEL_KEYS}
    GPTConfig(vocab_size=1, **model_cfg)  # shapes first: a bad model config fails before the data is looked at
    tc.device = device = resolve_device(tc.device)  # resolved once: later steps read tc.device
    tc.dtype = resolve_dtype(tc.dtype, device)
    check_impl_runs_on(cfg["attn_impl"], device.split(":")[0])
    meta = check_data(tc)
    gptconf = GPTConfig(vocab_size=meta["vocab_size"], **model_cfg)
    checkpoint = None
    if tc.init_from == "resume":
        checkpoint, gptconf = read_resume_checkpoint(tc, gptconf, explicit)
        check_same_dataset(checkpoint, meta, tc, os.path.join(tc.out_dir, "ckpt.pt"))
    elif is_run_folder(tc.init_from):  # a run of ours: its config (with the allowed changes), weights later
        source = os.path.join(tc.init_from, "ckpt.pt")
        checkpoint, gptconf = read_finetune_source(source, gptconf, explicit)
        check_same_dataset(checkpoint, meta, tc, source)
    elif tc.init_from != "scratch":  # GPT-2 weights: the (converted) config from its config.json, weights later
        gptconf = pretrained_config(tc.init_from, **overrides_from_keys(cfg, explicit))
        if gptconf.vocab_size != meta["vocab_size"]:
            raise ConfigError(f"init_from={tc.init_from} has vocab_size={gptconf.vocab_size} but dataset "
                              f"{tc.dataset!r} has {meta['vocab_size']}; use a GPT-2 BPE dataset such as shakespeare")
    check_fits_in_memory(gptconf, tc)
    check_wandb_ready(tc)
    check_token_files(os.path.join(tc.data_dir, tc.dataset), meta, gptconf.block_size)
    check_out_dir_holds_no_run(tc)
    try:
        os.makedirs(tc.out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create out_dir={tc.out_dir!r} ({e.strerror}); pick a writable folder") from None
    return tc, gptconf, meta, cfg, checkpoint


def check_out_dir_holds_no_run(tc):
    """A run that is not resumed would replace out_dir's checkpoints and log: only when asked.
    Rank 0 decides (under torchrun the other ranks would see rank 0's own lock)."""
    if int(os.environ.get("RANK", 0)) > 0:
        return
    RunLock(tc.out_dir).refuse_if_held()  # a live run there: say that first
    if tc.init_from == "resume" or tc.overwrite:
        return
    held = [name for name in ("ckpt.pt", "best.pt") if os.path.isfile(os.path.join(tc.out_dir, name))]
    if held:
        raise ConfigError(f"out_dir {tc.out_dir} already holds a run ({' and '.join(held)}); continue it with "
                          "--init_from=resume, or start over with --overwrite=True (its checkpoints and log are "
                          "replaced), or pick another --out_dir")


def read_resume_checkpoint(tc, gptconf, explicit):
    """out_dir/ckpt.pt, checked against the command line and the dataset before any work."""
    path = os.path.join(tc.out_dir, "ckpt.pt")
    if not os.path.exists(path) and os.path.isfile(os.path.join(tc.out_dir, "best.pt")):
        raise ConfigError(f"init_from=resume but {path} is missing while best.pt is there (the run was stopped "
                          "while writing its first checkpoint); start over with --init_from=scratch --overwrite=True")
    if not os.path.exists(path):
        raise ConfigError(f"init_from=resume but {path} does not exist; train with init_from=scratch first")
    ckpt = load_checkpoint(path, "cpu", required=RESUME_KEYS)
    saved = model_config_from_checkpoint(ckpt, path, attn_impl=gptconf.attn_impl, dropout=gptconf.dropout)
    differ = [f"{k}={getattr(gptconf, k)!r} (checkpoint: {getattr(saved, k)!r})" for k in sorted(explicit)
              if k in MODEL_KEYS and k not in RESUME_MAY_CHANGE and getattr(gptconf, k) != getattr(saved, k)]
    if differ:
        raise ConfigError(f"resume: {', '.join(differ)} differ from {path}; drop them or train a new out_dir")
    if saved.vocab_size != gptconf.vocab_size:
        raise ConfigError(f"resume: {path} has vocab_size={saved.vocab_size} but dataset {tc.dataset!r} has "
                          f"{gptconf.vocab_size}; resume on the dataset it was trained on")
    was = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    changed = [f"{k}={getattr(tc, k)} (checkpoint: {was[k]})" for k in ("seed", "batch_size",
               "gradient_accumulation_steps") if k in was and k in TRAIN_KEYS and was[k] != getattr(tc, k)]
    if changed and int(os.environ.get("RANK", 0)) == 0:  # allowed, but not the run an uninterrupted one would be
        print(f"note: resuming with {', '.join(changed)}: from here the batches differ from the run's own",
              file=sys.stderr)
    return ckpt, saved


def read_finetune_source(path, gptconf, explicit):
    """-> (checkpoint, GPTConfig): the source run's model config with the command line's changes to
    FINETUNE_MAY_CHANGE keys. A longer block_size keeps RoPE's original context at the trained one."""
    ckpt = load_checkpoint(path, "cpu", required=("model", "model_args"))
    saved = model_config_from_checkpoint(ckpt, path)
    differ = [f"{k}={getattr(gptconf, k)!r} (checkpoint: {getattr(saved, k)!r})" for k in sorted(explicit)
              if k in MODEL_KEYS and k not in FINETUNE_MAY_CHANGE and getattr(gptconf, k) != getattr(saved, k)]
    if differ:
        raise ConfigError(f"init_from: {', '.join(differ)} differ from {path}; a fine-tune may change only "
                          f"{', '.join(FINETUNE_MAY_CHANGE)}")
    changes = {k: getattr(gptconf, k) for k in FINETUNE_MAY_CHANGE if k in explicit}
    if saved.pos_encoding == "rope" and "rope_original_context" not in explicit and not saved.rope_original_context:
        changes["rope_original_context"] = saved.block_size   # what yarn's ramp is measured against
    if saved.pos_encoding == "learned" and changes.get("block_size", saved.block_size) > saved.block_size:
        raise ConfigError(f"init_from: {path} has learned positions for {saved.block_size} tokens only; "
                          f"fine-tune at block_size <= {saved.block_size}")
    if any(variant_class(a).context_within_block_size for a in saved.attention_plan) and \
            changes.get("block_size", saved.block_size) != saved.block_size:
        raise ConfigError(f"init_from: attention={saved.attention}'s pattern is drawn for block_size="
                          f"{saved.block_size} ({path}); fine-tune it at that block_size")
    if saved.vocab_size != gptconf.vocab_size:
        raise ConfigError(f"init_from: {path} has vocab_size={saved.vocab_size} but the dataset has "
                          f"{gptconf.vocab_size}; fine-tune on the dataset it was trained on")
    return ckpt, model_config_from_checkpoint(ckpt, path, **changes)


def check_same_dataset(ckpt, meta, tc, path):
    """A resume reads token ids as the checkpoint's dataset did (checkpoints without a record: not checked)."""
    saved = ckpt.get("meta")
    if not isinstance(saved, dict) or "vocab_size" not in saved:
        return
    was, now = dataset_identity(saved), dataset_identity(meta)
    if was != now:
        what = "characters" if was["chars_sha256"] != now["chars_sha256"] else "tokenizer"
        raise ConfigError(f"resume: dataset {tc.dataset!r} maps token ids to other {what} than {path} was trained "
                          f"on ({was['tokenizer']} vs {now['tokenizer']}); resume on the dataset it was trained on")


# ---- distributed setup ----
@dataclass
class Dist:
    device: str
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    strategy: str = ""  # "" (one process), "ddp" or "fsdp"

    @property
    def master(self):
        return self.rank == 0


def setup_distributed(tc: TrainConfig) -> Dist:
    device = tc.device  # resolved by load_settings
    if int(os.environ.get("RANK", -1)) == -1:  # not launched by torchrun
        return Dist(device)
    from torch.distributed import init_process_group
    dist = Dist(device, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]),
                tc.strategy)
    if device.startswith("cuda"):  # one GPU per rank
        dist.device = f"cuda:{dist.local_rank}"
        torch.cuda.set_device(dist.device)
    # NCCL is GPU-only: ranks on CPU (e.g. a laptop check of a DDP setup) talk over gloo
    init_process_group(backend=tc.backend if device.startswith("cuda") else "gloo")
    tc.gradient_accumulation_steps //= dist.world
    return dist


# ---- model and optimizer ----
def build_model(tc, gptconf, dist, checkpoint, ptdtype):
    """-> (model as called in the loop (compiled / DDP-wrapped), the raw GPT, optimizer, scaler)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
    torch.manual_seed(tc.seed)  # the same initial weights on every rank (FSDP shards them as they are)
    if tc.init_from in ("scratch", "resume"):
        raw = GPT(gptconf).to(dist.device)
    elif is_run_folder(tc.init_from):  # fine-tune: the run's weights, a fresh optimizer, iteration 0
        raw = model_from_checkpoint(checkpoint, gptconf, os.path.join(tc.init_from, "ckpt.pt")).train()
        raw = raw.to(dist.device)
    else:  # the same conversion load_settings checked, now with the weights
        raw = from_pretrained(tc.init_from, **{k: getattr(gptconf, k) for k in OVERRIDABLE}).to(dist.device)
    raw.n_params = raw.num_params()  # before sharding: counts whole tensors
    raw.train_flops_per_token = raw.flops_per_token()  # likewise (6N + attention, at block_size)
    if dist.strategy == "fsdp":
        shard_model(raw, ptdtype)
    device_type = dist.device.split(":")[0]
    optimizer = raw.configure_optimizers(tc.weight_decay, tc.learning_rate, (tc.beta1, tc.beta2), device_type)
    if tc.init_from == "resume":
        # full (unsharded) tensors, keyed by parameter name: the same checkpoint resumes
        # a single process, DDP or FSDP run
        try:
            set_state_dict(raw, optimizer, model_state_dict=checkpoint["model"],
                           optim_state_dict=checkpoint["optimizer"], options=StateDictOptions(full_state_dict=True))
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{tc.out_dir}/ckpt.pt does not fit its model config "
                                  f"({str(e).splitlines()[0][:160]})") from None
    scaler = torch.amp.GradScaler(device_type, enabled=ptdtype == torch.float16)
    model = torch.compile(raw) if tc.compile else raw
    if dist.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[dist.local_rank] if device_type == "cuda" else None)
    return model, raw, optimizer, scaler


def shard_model(model, param_dtype):
    """FSDP2: each Block is one unit (its weights all-gathered just before its forward and
    backward, freed after); the root unit holds the embeddings and the tied lm_head.
    Weights are gathered in the training dtype, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.h:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def clip_grad_norm(parameters, max_norm):
    """Scale the gradients so that their global L2 norm is at most max_norm -> the norm before.

    The squares are summed in float64. Under FSDP each rank sums its shards and the ranks
    add their sums; under DDP one rank sums whole tensors. In float32 the two orders round
    differently, the clip factor differs in its last bit, and at a high learning rate that
    bit grows chaotically (val loss 1.5e-3 apart after 20 steps at lr 1e-2). Summed in
    float64, both round to the same float32 factor: the strategies then run bit-identically."""
    from torch.distributed.tensor import DTensor
    grads = [p.grad for p in parameters if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]  # this rank's shard
    sq = torch.zeros((), dtype=torch.float64, device=local[0].device)
    for g in local:
        sq += torch.linalg.vector_norm(g, dtype=torch.float64).square()
    if any(isinstance(g, DTensor) for g in grads):  # shards: add the ranks' partial sums
        torch.distributed.all_reduce(sq)
    norm = sq.sqrt()
    factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in local:
        g.mul_(factor.to(g.dtype))
    return norm.float()


def get_lr(it, tc):
    """Linear warmup, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not tc.decay_lr:
        return tc.learning_rate
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / (tc.warmup_iters + 1)
    if it > tc.lr_decay_iters:
        return tc.min_lr
    ratio = (it - tc.warmup_iters) / max(1, tc.lr_decay_iters - tc.warmup_iters)
    return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (tc.learning_rate - tc.min_lr)


# ---- the run: state, evaluation, checkpoints, the loop ----
class Trainer:
    """One training run: the step, evaluation, checkpoints and the files in out_dir.
    Progress counters are cumulative over resumes (kept in the checkpoint)."""

    def __init__(self, tc, gptconf, meta, flat_cfg, dist, checkpoint):
        self.tc, self.gptconf, self.meta, self.flat_cfg, self.dist = tc, gptconf, meta, flat_cfg, dist
        self.device_type = dist.device.split(":")[0]
        self.ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[tc.dtype]
        self.autocast = (nullcontext() if tc.dtype == "float32"
                         else torch.autocast(self.device_type, dtype=self.ptdtype))
        self.model, self.raw, self.optimizer, self.scaler = build_model(tc, gptconf, dist, checkpoint, self.ptdtype)
        self.batches = Batches(os.path.join(tc.data_dir, tc.dataset), meta, gptconf.block_size, tc.batch_size,
                               dist.device, tc.seed, dist.rank)
        self.tokens_per_iter = tc.gradient_accumulation_steps * dist.world * tc.batch_size * gptconf.block_size
        self.kv_bytes = self.raw.cache_elems_per_token() * self.ptdtype.itemsize
        checkpoint = checkpoint if tc.init_from == "resume" else None  # a fine-tune starts at iteration 0
        progress = (checkpoint or {}).get("progress", {})
        self.iter_num = checkpoint["iter_num"] if checkpoint else 0
        self.best_val_loss = checkpoint["best_val_loss"] if checkpoint else float("inf")
        self.evaluated_at = progress.get("evaluated_at", self.iter_num if checkpoint else -1)
        self.saved_at = self.iter_num if checkpoint else -1              # iteration of ckpt.pt on disk
        self.wall_before = progress.get("wall_s", 0.0)            # time spent by earlier segments
        self.train_time = progress.get("train_time_s", 0.0)       # time inside training steps
        self.train_tokens = progress.get("train_tokens", 0)
        self.last_val = progress.get("last_val_loss")
        self.last_eval = progress.get("last_eval")                # the last metrics dict (see metrics)
        self.best_val_acc = progress.get("best_val_acc")          # examples: val accuracy at best_val_loss
        self.t_start = time.time()
        self.ckpt_path = os.path.join(tc.out_dir, "ckpt.pt")
        self.wandb = None

    def elapsed(self):
        return self.wall_before + time.time() - self.t_start

    @torch.no_grad()
    def estimate_loss(self):
        """Mean loss over the same eval_iters windows at every evaluation. Under torchrun the
        ranks share them out: rank r takes windows r, r + world, ... and the sums are
        all-reduced. Every rank runs the same number of forwards (under FSDP and DDP each one
        is a collective), so a rank short of a window runs a dummy one with weight 0."""
        tc, dist = self.tc, self.dist
        out = {}
        self.model.eval()
        for split in ("train", "val"):
            total = torch.zeros(2, device=dist.device)  # loss, and accuracy on the counted targets (examples)
            for X, Y, weight in self.batches.eval_windows(split, tc.eval_iters, dist.world):
                with self.autocast:
                    logits, loss = self.model(X, Y)
                hits = loss.new_zeros(())
                if self.batches.examples:  # a text dataset pays no argmax over the vocabulary
                    counted = Y != -1
                    hits = ((logits.argmax(-1) == Y) & counted).sum() / counted.sum().clamp_min(1)
                total += torch.stack([loss.float(), hits.float()]) * weight
            if dist.strategy:
                torch.distributed.all_reduce(total)
            out[split] = total[0].item() / tc.eval_iters
            if self.batches.examples:
                out[f"{split}_acc"] = total[1].item() / tc.eval_iters
        self.model.train()
        return out

    def train_step(self, X, Y, n_batch):
        """One optimizer step over gradient_accumulation_steps micro-batches.
        -> (next X, Y, n_batch, loss of the last micro-batch, global grad norm or None)."""
        tc, dist = self.tc, self.dist
        torch.manual_seed(self.batches.rank_seed(1, self.iter_num))  # this step's dropout masks
        for micro in range(tc.gradient_accumulation_steps):
            last_micro = micro == tc.gradient_accumulation_steps - 1
            if dist.strategy == "fsdp":  # sync (reduce-scatter) gradients only on the last micro step
                self.raw.set_requires_gradient_sync(last_micro)
            elif dist.strategy == "ddp":
                self.model.require_backward_grad_sync = last_micro
            with self.autocast:
                _, loss = self.model(X, Y)
                loss = loss / tc.gradient_accumulation_steps
            n_batch += 1
            X, Y = self.batches.train(n_batch)  # prefetch while the GPU works
            self.scaler.scale(loss).backward()
        grad_norm = None
        if tc.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            grad_norm = clip_grad_norm(self.raw.parameters(), tc.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return X, Y, n_batch, loss.detach() * tc.gradient_accumulation_steps, grad_norm

    @torch.no_grad()
    def check_weights_on(self, X, Y):
        """Before the checkpoint a signal asks for: the weights must still give a finite loss on the
        next batch. A diverging step can leave finite but blown-up weights after a finite loss (the
        watch saw nothing yet); saving them would replace the last good ckpt.pt. NonFinite if not."""
        self.model.eval()
        with self.autocast:
            _, loss = self.model(X, Y)
        self.model.train()
        if all_ranks_max(int(not torch.isfinite(loss).item()), self.dist):
            raise NonFinite(self.iter_num, "the weights give a non-finite loss on the next batch (the last step "
                                           "diverged)")

    def save(self, best=False):
        """Every rank calls it (under FSDP the full tensors are gathered); rank 0 writes
        ckpt.pt, and best.pt too when best (this iteration's evaluation is the best so far)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        model_sd, optim_sd = get_state_dict(self.raw, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.master:
            return
        weights = {"model": model_sd, "model_args": self.gptconf.to_dict(), "config": self.flat_cfg,
                   "meta": self.meta, "iter_num": self.iter_num, "best_val_loss": self.best_val_loss}
        if best:
            save_atomic(weights, os.path.join(self.tc.out_dir, "best.pt"))
        progress = {"wall_s": self.elapsed(), "train_time_s": self.train_time, "train_tokens": self.train_tokens,
                    "evaluated_at": self.evaluated_at, "last_val_loss": self.last_val, "last_eval": self.last_eval,
                    "best_val_acc": self.best_val_acc}
        save_atomic({**weights, "optimizer": optim_sd, "progress": progress,
                     "rng": {"scheme": "seeded by (seed, rank, step)", "seed": self.tc.seed}}, self.ckpt_path)
        self.saved_at = self.iter_num

    def tokens_per_sec(self):
        """Training tokens per second inside training steps (evaluations and saves left out)."""
        return self.train_tokens / self.train_time if self.train_time > 0 else 0.0

    def metrics(self, losses, lr):
        """The one record of an evaluation: the console line, a log.jsonl line and a wandb row
        are this dict, and summary.json keeps the last one as "last_eval"."""
        accuracy = {k: v for k, v in losses.items() if k.endswith("_acc")}  # examples datasets only
        return {"iter": self.iter_num, "train_loss": losses["train"], "val_loss": losses["val"], **accuracy,
                "lr": lr, "tokens_per_sec": self.tokens_per_sec(), "elapsed_s": self.elapsed(),
                "flops": self.raw.train_flops_per_token * self.train_tokens}

    def summary(self, finished, stopped=None):
        return {"attention": self.gptconf.attention, "pos_encoding": self.gptconf.pos_encoding,
                "n_kv_head": self.gptconf.n_kv_head, "params": self.raw.n_params,
                "best_val_loss": self.best_val_loss, "final_val_loss": self.last_val, "iters": self.iter_num,
                "max_iters": self.tc.max_iters, "tokens_per_sec": self.tokens_per_sec(), "tokens": self.train_tokens,
                "flops_per_token": self.raw.train_flops_per_token, "learning_rate": self.tc.learning_rate,
                "train_flops": self.raw.train_flops_per_token * self.train_tokens,
                "train_time_s": self.train_time, "peak_mem_bytes": peak_memory_bytes(self.device_type),
                "kv_cache_bytes_per_token": self.kv_bytes, "cache_state_bytes": self.raw.cache_state_elems() * 4,
                "wall_s": self.elapsed(), "device": self.dist.device, "dtype": self.tc.dtype,
                "threads": torch.get_num_threads(),
                "dataset": self.tc.dataset, "seed": self.tc.seed,
                "attn_impl": self.raw.attn_impl_report(), "finished": finished, "stopped": stopped,
                "settings": self.flat_cfg,
                **self.accuracy_summary(),
                "last_eval": self.last_eval}

    def accuracy_summary(self):
        """Datasets of examples: final_val_acc (the last evaluation) and best_val_acc (the evaluation
        best.pt was saved at), the share of counted targets predicted exactly (greedy)."""
        if not self.batches.examples:
            return {}
        return {"final_val_acc": (self.last_eval or {}).get("val_acc"), "best_val_acc": self.best_val_acc}

    def write_summary(self, finished, stopped=None):
        if self.dist.master:
            write_summary(self.tc.out_dir, self.summary(finished, stopped))

    def evaluate_and_save(self, lr, log_file):
        """Evaluate; refuse to save non-finite losses; log, then ckpt.pt/best.pt and summary.json."""
        losses = self.estimate_loss()
        if not all(math.isfinite(v) for v in losses.values()):
            raise NonFinite(self.iter_num, f"evaluation gave train {losses['train']}, val {losses['val']}")
        if self.tc.eval_only:  # a look at the checkpoint: its files stay as they are
            if self.dist.master:
                print(f"eval {self.iter_num}: train {losses['train']:.4f}, val {losses['val']:.4f}")
            return
        self.last_val, self.evaluated_at = losses["val"], self.iter_num
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        m = self.last_eval = self.metrics(losses, lr)
        if self.dist.master:
            accuracy = f", val acc {m['val_acc']:.3f}" if "val_acc" in m else ""
            print(f"eval {m['iter']}: train {m['train_loss']:.4f}, val {m['val_loss']:.4f}{accuracy}")
            append_log(log_file, m)
        if self.wandb:
            self.wandb.log(m, step=m["iter"])
        improved = losses["val"] <= self.best_val_loss
        if improved and "val_acc" in losses:
            self.best_val_acc = losses["val_acc"]
        if self.iter_num > 0 and (self.tc.always_save_checkpoint or improved):
            self.save(best=improved)
        self.write_summary(finished=False)


def train_loop(trainer: Trainer, signals: StopSignals, log_file):
    """Evaluate at eval_interval; step; print a line every log_interval; stop on a signal.
    Returns None when done, or the signal number that stopped it (checkpoint written)."""
    tc, dist, raw = trainer.tc, trainer.dist, trainer.raw
    watch = BadStepWatch(dist.device, trainer.ptdtype == torch.float16)
    n_batch = trainer.iter_num * tc.gradient_accumulation_steps  # this rank's batches drawn so far
    X, Y = trainer.batches.train(n_batch)
    window_t, window_iters = time.time(), 0
    while True:
        lr = get_lr(trainer.iter_num, tc)
        for group in trainer.optimizer.param_groups:
            group["lr"] = lr
        at_eval = trainer.iter_num % tc.eval_interval == 0 or trainer.iter_num == tc.max_iters
        t_eval = time.time()
        if (at_eval and trainer.evaluated_at != trainer.iter_num) or tc.eval_only:
            watch.check(dist)  # never evaluate (and save) weights a bad step has touched
            trainer.evaluate_and_save(lr, log_file)
        window_t += time.time() - t_eval  # keep eval out of the ms/iter figure
        if trainer.iter_num >= tc.max_iters or tc.eval_only:
            return None
        t0 = time.time()
        X, Y, n_batch, loss, grad_norm = trainer.train_step(X, Y, n_batch)
        watch.update(trainer.iter_num, loss, grad_norm)
        trainer.iter_num += 1
        trainer.train_time += time.time() - t0
        trainer.train_tokens += trainer.tokens_per_iter
        window_iters += 1
        stop = all_ranks_max(signals.received, dist)  # every rank stops at the same iteration
        if stop:
            watch.check(dist)
            trainer.check_weights_on(X, Y)
            trainer.save()
            trainer.write_summary(finished=False, stopped=signals.name_of(stop))
            return stop
        if trainer.iter_num % tc.log_interval == 0 or trainer.iter_num == tc.max_iters:
            watch.check(dist)
            if dist.master:
                dt = (time.time() - window_t) / window_iters
                print(progress_line(trainer, raw, loss.item(), lr, dt))
                if trainer.wandb:  # curves between evaluations, as nanoGPT users expect
                    trainer.wandb.log({"train/loss": loss.item(), "train/lr": lr,
                                       "train/tokens_per_sec": trainer.tokens_per_iter / dt}, step=trainer.iter_num)
            window_t, window_iters = time.time(), 0


def progress_line(trainer, raw, loss, lr, dt):
    tc = trainer.tc
    mfu = raw.estimate_mfu(trainer.tokens_per_iter / dt, torch.device(trainer.dist.device))
    eta = dt * (tc.max_iters - trainer.iter_num)
    return (f"iter {trainer.iter_num}/{tc.max_iters} | loss {loss:.4f} | lr {lr:.2e} | {dt * 1000:.1f} ms/iter | "
            f"{trainer.tokens_per_iter / dt:,.0f} tok/s | mfu {'n/a' if mfu is None else f'{mfu:.1%}'} | "
            f"eta {int(eta // 60)}m{int(eta % 60):02d}s")


def start_wandb(trainer, run_name, config_files=()):
    """The run's config: every key, the config file(s) it came from, the model's sizes. Rows: each
    evaluation's metrics dict, and train/loss, train/lr, train/tokens_per_sec every log_interval."""
    import wandb
    tc, raw = trainer.tc, trainer.raw
    wandb.init(project=tc.wandb_project, group=tc.wandb_group or None, name=run_name, resume="allow",
               config={**trainer.flat_cfg, "config_files": list(config_files),
                       "n_kv_head": trainer.gptconf.n_kv_head, "params": raw.n_params,
                       "kv_cache_bytes_per_token": trainer.kv_bytes, "cache_state_bytes": raw.cache_state_elems() * 4})
    return wandb


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):  # after config files: show their values
        try:
            print(train_help([a for a in argv if not a.startswith("-")]))
        except ValueError as e:
            fail(str(e))
        return
    try:
        tc, gptconf, meta, flat_cfg, checkpoint = load_settings(argv)
    except ValueError as e:  # ConfigError, CheckpointError and GPTConfig's validation
        if int(os.environ.get("RANK", 0)) > 0:
            sys.exit(2)  # under torchrun, rank 0 says it once
        fail(str(e))
    master = int(os.environ.get("RANK", 0)) == 0
    lock = RunLock(tc.out_dir) if master else None
    try:
        if lock:
            lock.acquire()
            remove_stale_tmp(tc.out_dir)
    except ConfigError as e:
        fail(str(e))
    signals = StopSignals()
    try:
        code = run(tc, gptconf, meta, flat_cfg, checkpoint, signals, [a for a in argv if not a.startswith("--")])
    finally:
        signals.restore()
        if lock:
            lock.release()
    if code:
        sys.exit(code)


def open_run_files(trainer, config_files=()):
    """Rank 0: the header line (and notes), wandb, and log.jsonl cut back to a resumed checkpoint."""
    tc, gptconf, dist = trainer.tc, trainer.gptconf, trainer.dist
    if tc.max_iters < tc.lr_decay_iters and tc.decay_lr:
        print(f"note: lr_decay_iters={tc.lr_decay_iters} > max_iters={tc.max_iters}: the learning rate will not "
              f"decay to min_lr; set --lr_decay_iters={tc.max_iters} for a full cosine", file=sys.stderr)
    run_name = tc.wandb_run_name or f"{gptconf.attention}-{gptconf.pos_encoding}"
    impl = trainer.raw.attn_impl_report()
    print(f"{run_name}: {trainer.raw.n_params / 1e6:.2f}M params, {trainer.tokens_per_iter:,} tokens/iter, "
          f"device {dist.device} {tc.dtype}, attn_impl {impl['used']}"
          + (f" (requested {impl['requested']}: {impl['why']})" if impl["why"] else ""))
    trainer.wandb = start_wandb(trainer, run_name, config_files) if tc.wandb_log else None
    if tc.init_from == "resume":
        print(f"resumed from iteration {trainer.iter_num} of {tc.out_dir}/ckpt.pt "
              f"(best val {trainer.best_val_loss:.4f})")
    return open_log(tc.out_dir, trainer.iter_num if tc.init_from == "resume" else None)


def run(tc, gptconf, meta, flat_cfg, checkpoint, signals, config_files=()):
    """Train (or evaluate); returns the exit status (0, 3 or 128 + signal)."""
    dist = setup_distributed(tc)
    threads, why = use_cpu_threads(tc.threads, dist.device)
    if dist.master and dist.device.startswith("cpu"):
        print(f"cpu threads: {threads} ({why})")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        trainer = Trainer(tc, gptconf, meta, flat_cfg, dist, checkpoint)
    except CheckpointError as e:
        fail(str(e))
    checkpoint = None  # the trainer holds what it needs; free the loaded tensors
    log_file = open_run_files(trainer, config_files) if dist.master else None
    code = 0
    try:
        stopped_by = train_loop(trainer, signals, log_file)
        if stopped_by:
            code = 128 + stopped_by
            if dist.master:
                print(f"stopped at iter {trainer.iter_num} by {signals.name_of(stopped_by)}, checkpoint saved; "
                      f"resume with --init_from=resume", file=sys.stderr)
        elif not tc.eval_only:
            trainer.write_summary(finished=True)
    except WriteError as e:  # disk full or read-only: the last good files stay; resume once there is room
        code = 2
        if dist.master:
            print(f"error: {e}; then resume with --init_from=resume", file=sys.stderr)
    except NonFinite as e:
        code = 3
        if dist.master:
            trainer.write_summary(finished=False, stopped="non-finite loss")
            kept = f"{trainer.ckpt_path} (iter {trainer.saved_at}) is kept" if trainer.saved_at >= 0 \
                else "no checkpoint was written"
            print(f"error: {e}; stopped, {kept}; lower learning_rate (now {tc.learning_rate:g}), "
                  f"set grad_clip, or use dtype=float32", file=sys.stderr)
    finally:
        if log_file:
            log_file.close()
        if trainer.wandb:
            trainer.wandb.summary.update(trainer.summary(finished=code == 0))
            trainer.wandb.finish()
        if dist.strategy:
            # drain every rank's last collective first: a Gloo worker still releasing one while the
            # process group is torn down can deadlock on the GIL
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
    return code


if __name__ == "__main__":
    main()
