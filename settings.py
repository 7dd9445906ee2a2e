"""Every key train.py takes: TrainConfig (the run) beside GPTConfig (the model), and the parser
that turns config files and --key=value overrides into both. Tools that build models from
the same keys (bench.py, plan.py, sweep.py) import this, never train.py.
"""
from dataclasses import asdict, dataclass, fields

from configurator import parse_config
from model import GPTConfig


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"
    eval_interval: int = 250      # evaluate, log and checkpoint every this many iterations
    log_interval: int = 10        # console line every this many iterations
    eval_iters: int = 200         # batches per split per evaluation
    eval_only: bool = False
    init_from: str = "scratch"    # scratch | resume (from out_dir/ckpt.pt)
    # wandb
    wandb_log: bool = False
    wandb_project: str = "which-attention"
    wandb_group: str = ""
    wandb_run_name: str = ""      # default: <attention>-<pos_encoding>
    # data: data_dir/dataset/{train,val}.bin + meta.json
    dataset: str = "shakespeare_char"
    data_dir: str = "data"
    gradient_accumulation_steps: int = 1
    batch_size: int = 12
    # AdamW and the cosine schedule with linear warmup
    learning_rate: float = 6e-4
    max_iters: int = 2000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0        # 0 disables
    decay_lr: bool = True
    warmup_iters: int = 100
    lr_decay_iters: int = 2000
    min_lr: float = 6e-5
    # system
    backend: str = "nccl"         # process-group backend under torchrun on GPUs (CPU ranks use gloo)
    strategy: str = "ddp"         # under torchrun: ddp (every rank holds the whole model and optimizer) |
                                  # fsdp (FSDP2: weights, grads and AdamW state sharded across ranks,
                                  # each Block gathered in param dtype for its forward/backward)
    device: str = "auto"          # auto (cuda if present) | cpu | cuda | cuda:N | mps
    dtype: str = "auto"           # auto (bfloat16 on CUDA if supported, else float32) | float32 | bfloat16 | float16
    compile: bool = False
    seed: int = 1337


MODEL_KEYS = {f.name: f.type for f in fields(GPTConfig) if f.name != "vocab_size"}
TRAIN_KEYS = {f.name: f.type for f in fields(TrainConfig)}


def parse_keys(argv) -> dict:
    """Config files and --key=value overrides -> every train and model key (type-checked)."""
    defaults = {**asdict(TrainConfig()), **{k: getattr(GPTConfig, k) for k in MODEL_KEYS}}
    return parse_config(argv, {**TRAIN_KEYS, **MODEL_KEYS}, defaults)
