"""The run itself: Trainer (the step, evaluation, checkpoints, summary.json and log.jsonl) and the
loop that evaluates, steps, logs and stops on a signal."""
import math
import os
import sys
import time
from contextlib import nullcontext

import torch

from trainer.batches import Batches
from trainer.build import build_model, clip_grad_norm, get_lr
from trainer.checkpoint import save_atomic
from trainer.rundir import append_log, open_log, write_summary
from trainer.runfiles import BadStepWatch, NonFinite, StopSignals, all_ranks_max, peak_memory_bytes


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
        self.target_reached_iter = progress.get("target_reached_iter")  # the evaluation val_acc >= stop_val_acc
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
                    logits, loss = self.model(X, Y, counted_only=self.batches.examples)
                hits = loss.new_zeros(())
                if self.batches.examples:  # a text dataset pays no argmax over the vocabulary
                    answers = Y[Y != -1]                              # the logits' rows, in the same order
                    hits = (logits.argmax(-1) == answers).sum() / max(answers.numel(), 1)
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
                _, loss = self.model(X, Y, counted_only=self.batches.examples)
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
            _, loss = self.model(X, Y, counted_only=self.batches.examples)
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
                   "dtype": self.tc.dtype,   # as resolved (dtype=auto depends on the machine): a resume keeps it
                   "meta": self.meta, "iter_num": self.iter_num, "best_val_loss": self.best_val_loss}
        if best:
            save_atomic(weights, os.path.join(self.tc.out_dir, "best.pt"))
        progress = {"wall_s": self.elapsed(), "train_time_s": self.train_time, "train_tokens": self.train_tokens,
                    "evaluated_at": self.evaluated_at, "last_val_loss": self.last_val, "last_eval": self.last_eval,
                    "best_val_acc": self.best_val_acc, "target_reached_iter": self.target_reached_iter}
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
        return {"final_val_acc": (self.last_eval or {}).get("val_acc"), "best_val_acc": self.best_val_acc,
                "stop_val_acc": self.tc.stop_val_acc or None, "target_reached_iter": self.target_reached_iter}

    def reached_target(self) -> bool:
        """stop_val_acc is set and an evaluation reached it: the run is done."""
        return self.target_reached_iter is not None

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
        if self.tc.stop_val_acc and losses.get("val_acc", 0) >= self.tc.stop_val_acc:
            self.target_reached_iter = self.iter_num
            if self.dist.master:
                print(f"val acc {losses['val_acc']:.3f} reached stop_val_acc={self.tc.stop_val_acc} at iter "
                      f"{self.iter_num}: done")
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
        if trainer.iter_num >= tc.max_iters or tc.eval_only or trainer.reached_target():
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
