"""What a run is built from: the distributed setup (one process, DDP or FSDP), the model and its
optimizer (from scratch, a checkpoint or GPT-2 weights), the learning-rate schedule, the gradient clip."""
import math
import os
from dataclasses import dataclass

import torch

from model import GPT
from pretrained import OVERRIDABLE, from_pretrained
from trainer.checkpoint import CheckpointError, is_run_folder, model_from_checkpoint
from trainer.settings import TrainConfig


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
    raw.train_flops_per_token = raw.flops_per_token()  # likewise (6N + attention as computed, at block_size)
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
