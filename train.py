"""Train a GPT with the attention of your choice.

    python train.py config/gqa.py                       # a config file, then overrides
    python train.py config/gqa.py --batch_size=32 --device=cpu
    torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt2_124m.py   # DDP
    torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt2_124m.py --strategy=fsdp

Writes to out_dir: ckpt.pt (latest, at every eval), log.jsonl (one line per eval) and
summary.json (at the end). init_from=resume continues from out_dir/ckpt.pt.
"""
import json
import math
import os
import resource
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from configurator import ConfigError, fail
from attention.base import check_impl_runs_on
from model import GPT, GPTConfig
from settings import MODEL_KEYS, TRAIN_KEYS, TrainConfig, parse_keys


def load_settings(argv):
    """Parse, then validate everything (model shape included) before any work."""
    cfg = parse_keys(argv)
    tc = TrainConfig(**{k: cfg[k] for k in TRAIN_KEYS})
    if tc.init_from not in ("scratch", "resume"):
        raise ConfigError(f"init_from={tc.init_from!r}; choose scratch or resume")
    if tc.strategy not in ("ddp", "fsdp"):
        raise ConfigError(f"strategy={tc.strategy!r}; choose ddp or fsdp")
    if tc.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype={tc.dtype!r}; choose auto, float32, bfloat16 or float16")
    for key in ("eval_interval", "log_interval", "eval_iters", "batch_size", "gradient_accumulation_steps"):
        if getattr(tc, key) < 1:
            raise ConfigError(f"{key}={getattr(tc, key)} must be at least 1")
    world = int(os.environ.get("WORLD_SIZE", 1)) if "RANK" in os.environ else 1  # torchrun sets both
    if tc.gradient_accumulation_steps % world:
        raise ConfigError(f"gradient_accumulation_steps={tc.gradient_accumulation_steps} (the total over all ranks) "
                          f"must be a multiple of the {world} ranks")
    model_cfg = {k: cfg[k] for k in MODEL_KEYS}
    GPTConfig(vocab_size=1, **model_cfg)  # shapes first: a bad model config fails before the data is looked at
    on_cuda = tc.device.startswith("cuda") or (tc.device == "auto" and torch.cuda.is_available())
    check_impl_runs_on(cfg["attn_impl"], "cuda" if on_cuda else "cpu")
    data = os.path.join(tc.data_dir, tc.dataset)
    missing = [f for f in ("train.bin", "val.bin", "meta.json") if not os.path.exists(os.path.join(data, f))]
    if missing:
        script = os.path.join("data", tc.dataset, "prepare.py")
        how = f"python {script} --out_dir {data}" if os.path.exists(script) else f"add data/{tc.dataset}/prepare.py"
        raise ConfigError(f"dataset {tc.dataset!r} is missing {', '.join(missing)} in {data}; make it with: {how}")
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    gptconf = GPTConfig(vocab_size=meta["vocab_size"], **model_cfg)
    try:
        os.makedirs(tc.out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create out_dir={tc.out_dir!r} ({e.strerror}); pick a writable folder") from None
    return tc, gptconf, meta, cfg


def main(argv=None):
    try:
        tc, gptconf, meta, flat_cfg = load_settings(sys.argv[1:] if argv is None else argv)
    except ValueError as e:  # ConfigError and GPTConfig's validation
        if int(os.environ.get("RANK", 0)) > 0:
            sys.exit(2)  # under torchrun, rank 0 says it once
        fail(str(e))

    # ---- distributed setup (torchrun sets RANK) ----
    distributed = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    device = tc.device if tc.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if distributed:
        rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
        tc.gradient_accumulation_steps //= world
        from torch.distributed import init_process_group
        if device.startswith("cuda"):  # one GPU per rank
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
        # NCCL is GPU-only: ranks on CPU (e.g. a laptop check of a DDP setup) talk over gloo
        init_process_group(backend=tc.backend if device.startswith("cuda") else "gloo")
    else:
        rank, world = 0, 1
    master = rank == 0
    fsdp = distributed and tc.strategy == "fsdp"
    ddp = distributed and not fsdp
    device_type = "cuda" if "cuda" in device else device
    if device_type == "cuda" and not torch.cuda.is_available():
        fail("device=cuda but CUDA is not available; use --device=cpu")
    dtype = tc.dtype if tc.dtype != "auto" else (
        "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32")
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    autocast = nullcontext() if device_type == "cpu" or dtype == "float32" else torch.autocast(device_type, dtype=ptdtype)
    # Randomness a resumed run must repeat is a function of (seed, rank, step) alone: training
    # batch n of rank r, and the dropout masks of each step. Resuming then
    # reproduces the uninterrupted run on every rank, with no RNG state to gather or restore.
    # Every evaluation reads the same windows, so losses compare across evals.
    batch_gen, eval_gen = torch.Generator(), torch.Generator()

    def rank_seed(stream, n):  # stream 0: training batches, 1: dropout
        return ((tc.seed * 1_000_003 + rank) * 2 + stream) * 1_000_003 + n
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    ckpt_path = os.path.join(tc.out_dir, "ckpt.pt")
    iter_num, best_val_loss, checkpoint = 0, float("inf"), None
    if tc.init_from == "resume":
        if not os.path.exists(ckpt_path):
            fail(f"init_from=resume but {ckpt_path} does not exist; train with init_from=scratch first")
        checkpoint = torch.load(ckpt_path, map_location=device, weights_only=True)
        gptconf = GPTConfig.from_dict({**checkpoint["model_args"], "attn_impl": gptconf.attn_impl})
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    tokens_per_iter = tc.gradient_accumulation_steps * world * tc.batch_size * gptconf.block_size

    # ---- data: random windows from the memmap (re-opened each call: np.memmap leaks otherwise) ----
    data_dir = os.path.join(tc.data_dir, tc.dataset)
    np_dtype = np.dtype(meta.get("dtype", "uint16"))
    for split in ("train", "val"):
        size = os.path.getsize(os.path.join(data_dir, f"{split}.bin"))
        if size % np_dtype.itemsize:
            fail(f"{split}.bin is {size} bytes, not a whole number of {np_dtype} tokens (meta.json); re-run the prepare script")
        n = size // np_dtype.itemsize
        if n <= gptconf.block_size:
            fail(f"{split}.bin holds {n} tokens, not more than block_size={gptconf.block_size}; lower block_size")

    def get_batch(split, gen, load=True):
        """batch_size random windows drawn from gen; load=False only draws them (keeps gen in step)."""
        data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np_dtype, mode="r")
        ix = torch.randint(len(data) - gptconf.block_size, (tc.batch_size,), generator=gen)
        if not load:
            return None
        x = torch.stack([torch.from_numpy(data[i:i + gptconf.block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + gptconf.block_size].astype(np.int64)) for i in ix])
        if device_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    def train_batch(n):
        return get_batch("train", batch_gen.manual_seed(rank_seed(0, n)))

    # ---- model, optimizer ----
    torch.manual_seed(tc.seed)  # the same initial weights on every rank (FSDP shards them as they are)
    model = GPT(gptconf).to(device)
    n_params = model.num_params()  # before sharding: counts whole tensors
    if fsdp:
        shard_model(model, ptdtype)
    optimizer = model.configure_optimizers(tc.weight_decay, tc.learning_rate, (tc.beta1, tc.beta2), device_type)
    if checkpoint is not None:
        # full (unsharded) tensors, keyed by parameter name: the same checkpoint resumes
        # a single process, DDP or FSDP run
        set_state_dict(model, optimizer, model_state_dict=checkpoint["model"],
                       optim_state_dict=checkpoint["optimizer"], options=StateDictOptions(full_state_dict=True))
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
    kv_bytes = raw_model.cache_elems_per_token() * ptdtype.itemsize

    @torch.no_grad()
    def estimate_loss():
        """Mean loss over the same eval_iters windows at every evaluation. Under torchrun the
        ranks share them out: rank r takes windows r, r + world, ... and the sums are
        all-reduced. Every rank runs the same number of forwards (under FSDP and DDP each one
        is a collective), so a rank short of a window runs a dummy one with weight 0."""
        out = {}
        model.eval()
        eval_gen.manual_seed(tc.seed + 1)
        dummy = torch.zeros(tc.batch_size, gptconf.block_size, dtype=torch.long, device=device)
        for split in ("train", "val"):
            total = torch.zeros((), device=device)
            for k in range(math.ceil(tc.eval_iters / world) * world):
                real, mine = k < tc.eval_iters, k % world == rank
                if real:  # every rank draws every window, in order; it loads only its own
                    batch = get_batch(split, eval_gen, load=mine)
                if mine:
                    X, Y = batch if real else (dummy, dummy)
                    with autocast:
                        _, loss = model(X, Y)
                    total += loss.float() * real
            if distributed:
                torch.distributed.all_reduce(total)
            out[split] = total.item() / tc.eval_iters
        model.train()
        return out

    def get_lr(it):
        if not tc.decay_lr:
            return tc.learning_rate
        if it < tc.warmup_iters:
            return tc.learning_rate * (it + 1) / (tc.warmup_iters + 1)
        if it > tc.lr_decay_iters:
            return tc.min_lr
        ratio = (it - tc.warmup_iters) / max(1, tc.lr_decay_iters - tc.warmup_iters)
        return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (tc.learning_rate - tc.min_lr)

    def save_checkpoint():
        """Every rank calls it (under FSDP the full tensors are gathered); rank 0 writes."""
        model_sd, optim_sd = get_state_dict(raw_model, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not master:
            return
        ckpt = {"model": model_sd, "optimizer": optim_sd,
                "model_args": gptconf.to_dict(), "config": flat_cfg, "meta": meta,
                "iter_num": iter_num, "best_val_loss": best_val_loss,
                "rng": {"scheme": "seeded by (seed, rank, step)", "seed": tc.seed}}
        tmp = ckpt_path + ".tmp"
        torch.save(ckpt, tmp)
        os.replace(tmp, ckpt_path)  # never a half-written ckpt.pt

    wandb = None
    if master:
        os.makedirs(tc.out_dir, exist_ok=True)
        run_name = tc.wandb_run_name or f"{gptconf.attention}-{gptconf.pos_encoding}"
        print(f"{run_name}: {n_params / 1e6:.2f}M params, {tokens_per_iter:,} tokens/iter, "
              f"device {device} {dtype}, attn_impl {gptconf.attn_impl}")
        if tc.wandb_log:
            import wandb
            wandb.init(project=tc.wandb_project, group=tc.wandb_group or None, name=run_name,
                       config={**flat_cfg, "n_kv_head": gptconf.n_kv_head, "params": n_params,
                               "kv_cache_bytes_per_token": kv_bytes,
                               "cache_state_bytes": raw_model.cache_state_elems() * 4})
    log_mode = "a" if tc.init_from == "resume" else "w"
    log_file = open(os.path.join(tc.out_dir, "log.jsonl"), log_mode) if master else None

    # ---- training loop ----
    n_batch = iter_num * tc.gradient_accumulation_steps  # this rank's batches drawn so far
    X, Y = train_batch(n_batch)
    start_iter, t_start = iter_num, time.time()
    train_time, train_tokens, window_t, window_iters = 0.0, 0, time.time(), 0
    last_val = None
    while True:
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        is_eval = iter_num % tc.eval_interval == 0 or iter_num == tc.max_iters
        if checkpoint is not None and iter_num == start_iter:
            is_eval = False  # just resumed: evaluated and saved already
        t_eval = time.time()
        if is_eval:  # every rank evaluates its share of the windows, rank 0 logs
            losses = estimate_loss()
            last_val = losses["val"]
            best_val_loss = min(best_val_loss, losses["val"])
            tps = train_tokens / train_time if train_time > 0 else 0.0
            record = {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"], "lr": lr,
                      "tokens_per_sec": tps, "elapsed_s": time.time() - t_start}
            if master:
                print(f"eval {iter_num}: train {losses['train']:.4f}, val {losses['val']:.4f}")
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
            if wandb:
                wandb.log(record, step=iter_num)
        if is_eval and iter_num > 0:
            save_checkpoint()
        window_t += time.time() - t_eval  # keep eval out of the ms/iter figure
        if iter_num >= tc.max_iters or tc.eval_only:
            break

        torch.manual_seed(rank_seed(1, iter_num))  # this step's dropout masks
        t0 = time.time()
        for micro in range(tc.gradient_accumulation_steps):
            last_micro = micro == tc.gradient_accumulation_steps - 1
            if fsdp:  # sync (reduce-scatter) gradients only on the last micro step
                raw_model.set_requires_gradient_sync(last_micro)
            elif ddp:
                model.require_backward_grad_sync = last_micro
            with autocast:
                _, loss = model(X, Y)
                loss = loss / tc.gradient_accumulation_steps
            n_batch += 1
            X, Y = train_batch(n_batch)  # prefetch while the GPU works
            scaler.scale(loss).backward()
        if tc.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        train_time += time.time() - t0
        train_tokens += tokens_per_iter
        window_iters += 1

        if master and (iter_num % tc.log_interval == 0 or iter_num == tc.max_iters):
            dt = (time.time() - window_t) / window_iters
            mfu = raw_model.estimate_mfu(tokens_per_iter / dt, torch.device(device))
            eta = dt * (tc.max_iters - iter_num)
            print(f"iter {iter_num}/{tc.max_iters} | loss {loss.item() * tc.gradient_accumulation_steps:.4f} | "
                  f"lr {lr:.2e} | {dt * 1000:.1f} ms/iter | {tokens_per_iter / dt:,.0f} tok/s | "
                  f"mfu {'n/a' if mfu is None else f'{mfu:.1%}'} | eta {int(eta // 60)}m{int(eta % 60):02d}s")
            window_t, window_iters = time.time(), 0

    if master:
        summary = {"attention": gptconf.attention, "pos_encoding": gptconf.pos_encoding,
                   "n_kv_head": gptconf.n_kv_head, "params": n_params, "best_val_loss": best_val_loss,
                   "final_val_loss": last_val, "iters": iter_num,
                   "tokens_per_sec": train_tokens / train_time if train_time > 0 else 0.0,
                   "peak_mem_bytes": peak_memory_bytes(device_type),
                   "kv_cache_bytes_per_token": kv_bytes, "cache_state_bytes": raw_model.cache_state_elems() * 4,
                   "wall_s": time.time() - t_start,
                   "device": device, "dtype": dtype, "dataset": tc.dataset}
        with open(os.path.join(tc.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        log_file.close()
        if wandb:
            wandb.summary.update(summary)
            wandb.finish()
    if distributed:
        # drain every rank's last collective first: a Gloo worker still releasing one while the
        # process group is torn down can deadlock on the GIL
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def shard_model(model, param_dtype):
    """FSDP2: each Block is one unit (its weights all-gathered just before its forward and
    backward, freed after); the root unit holds the embeddings and the tied lm_head.
    Weights are gathered in the training dtype, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.h:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def peak_memory_bytes(device_type):
    """Peak CUDA memory allocated, or on CPU the process's peak resident set size."""
    if device_type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    main()
