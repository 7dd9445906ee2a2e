"""Every key train.py takes: TrainConfig (the run) beside GPTConfig (the model), the parser
that turns config files and --key=value overrides into both, and the checks that refuse a
bad value in one line before any work. Tools that build models from the same keys
(tools/bench.py, plan.py, sweep.py) import this, never train.py.
"""
import hashlib
import inspect
import json
import os
import re
from dataclasses import asdict, dataclass, fields

import torch

from model import GPTConfig
from trainer.cli import ConfigError, parse_config

PRETRAINED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"          # ckpt.pt, best.pt, log.jsonl, summary.json and the lock file go here
    eval_interval: int = 250      # evaluate, log and checkpoint every this many iterations
    log_interval: int = 10        # console line every this many iterations
    eval_iters: int = 200         # batches per split per evaluation
    eval_only: bool = False       # evaluate the checkpoint once and stop (needs init_from=resume)
    always_save_checkpoint: bool = True  # False: write ckpt.pt only when val loss improves (nanoGPT's key)
    stop_val_acc: float = 0.0     # datasets of examples (e.g. MQAR): end the run, finished, at the first evaluation
                                  # whose val accuracy reaches this (e.g. 0.99; summary.json: target_reached_iter);
                                  # 0 = run to max_iters
    init_from: str = "scratch"    # scratch | resume (from out_dir/ckpt.pt) | gpt2 | gpt2-medium | gpt2-large |
                                  # gpt2-xl | a folder with GPT-2's config.json + model.safetensors | a run's
                                  # out_dir (holding ckpt.pt): fine-tune its weights from iteration 0 with a new
                                  # optimizer; block_size and the RoPE scaling keys may change (FINETUNE_MAY_CHANGE)
    overwrite: bool = False       # True: a run not resumed may replace the checkpoints and log of a run already
                                  # in out_dir (without it, train.py refuses such a folder)
    # wandb
    wandb_log: bool = False
    wandb_project: str = "which-attention"
    wandb_group: str = ""         # e.g. the sweep's name, so its runs plot together
    wandb_run_name: str = ""      # default: <attention>-<pos_encoding>
    # data: data_dir/dataset/{train,val}.bin + meta.json
    dataset: str = "shakespeare_char"
    data_dir: str = "data"
    gradient_accumulation_steps: int = 1  # micro-batches per step, summed over all ranks
    batch_size: int = 12          # sequences per micro-batch per rank
    # AdamW and the cosine schedule with linear warmup
    learning_rate: float = 6e-4   # peak, after warmup
    max_iters: int = 2000         # optimizer steps in total (a resumed run continues to it)
    weight_decay: float = 0.1     # on matrices only (not biases, norms)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0        # clip the global gradient norm to this; 0 disables
    decay_lr: bool = True         # False: constant learning_rate
    warmup_iters: int = 100       # linear warmup steps
    lr_decay_iters: int = 2000    # cosine decay ends here (at min_lr); usually = max_iters
    min_lr: float = 6e-5          # floor of the schedule
    # system
    backend: str = "nccl"         # process-group backend under torchrun on GPUs (CPU ranks use gloo)
    strategy: str = "ddp"         # under torchrun: ddp (every rank holds the whole model and optimizer) |
                                  # fsdp (FSDP2: weights, grads and AdamW state sharded across ranks,
                                  # each Block gathered in param dtype for its forward/backward)
    device: str = "auto"          # auto (cuda if present) | cpu | cuda | cuda:N | mps
    dtype: str = "auto"           # auto (bfloat16 on CUDA if supported, else float32; on CPUs with bf16 units
                                  # bfloat16 is opt-in: docs/speed.md) | float32 | bfloat16 | float16 (CUDA
                                  # only, with a GradScaler). bfloat16 runs under autocast: weights, optimizer,
                                  # softmax statistics (on a CPU all of softmax attention: attention/base.py
                                  # sdpa) and the linear family's state stay fp32. A resumed run
                                  # keeps the dtype it trained in unless --dtype is given
    compile: bool = False         # torch.compile the model
    threads: int = 0              # CPU runs: torch's threads; 0 = the visible cores less the processes running
                                  # at start (trainer/threads.py); OMP_NUM_THREADS, when set, is kept
    seed: int = 1337              # weights, batches and dropout masks all derive from it (0 <= seed < 2**32)


MODEL_KEYS = {f.name: f.type for f in fields(GPTConfig) if f.name != "vocab_size"}
TRAIN_KEYS = {f.name: f.type for f in fields(TrainConfig)}
# keys a resumed run may change (the chunk lengths: the same math, rounded otherwise, as rundir.py's
# SETTINGS_EXEMPT has it); every other model key must match the checkpoint
RESUME_MAY_CHANGE = ("attn_impl", "dropout", "delta_chunk", "gla_chunk")
# keys a fine-tune from a run's folder may change: a longer context with its RoPE stretched, as in
# position interpolation and YaRN; every other model key comes from the run's checkpoint
FINETUNE_MAY_CHANGE = (*RESUME_MAY_CHANGE, "block_size", "rope_scaling", "rope_factor", "rope_original_context",
                       "rope_beta_fast", "rope_beta_slow", "rope_attn_factor")


def parse_keys(argv, explicit: set | None = None) -> dict:
    """Config files and --key=value overrides -> every train and model key (type-checked).
    explicit, when given, receives the keys the user set."""
    defaults = {**asdict(TrainConfig()), **{k: getattr(GPTConfig, k) for k in MODEL_KEYS}}
    return parse_config(argv, {**TRAIN_KEYS, **MODEL_KEYS}, defaults, explicit)


def parse_shared_keys(config_file: str, shared: list) -> dict:
    """parse_keys for one of several configs given the same overrides (tools.plan, tools.bench): a
    variant's own key (e.g. --sparse_block=64 meant for bigbird) is kept only where a variant of this
    config's plan reads it, and left at its default elsewhere. train.py itself refuses such a key."""
    from attention import key_owners
    keys = parse_keys([config_file, *shared])
    owners, plan = key_owners(), set(keys["attention"].split(","))
    foreign = [o for o in shared if not set(owners.get(o[2:].partition("=")[0], plan)) & plan]
    return parse_keys([config_file, *(o for o in shared if o not in foreign)]) if foreign else keys


def weight_decay_fix(learning_rate):
    """The advice when learning_rate * weight_decay >= 1: an example that keeps the bound it states."""
    bound = 1 / learning_rate
    if learning_rate > 1:  # no usual weight_decay helps: the rate itself is the mistake (AdamW: ~1e-4 to 1e-2)
        return (f"learning_rate={learning_rate:g} is far above AdamW's usual 1e-4 to 1e-2: lower it (e.g. 6e-4), "
                f"or use weight_decay below {bound:g}")
    return f"use weight_decay below {bound:g} (e.g. 0.1)"  # bound >= 1 here


def check_train_values(tc: TrainConfig):
    """Impossible optimizer, schedule and loop values: one ConfigError line each."""
    at_least = {"eval_interval": 1, "log_interval": 1, "eval_iters": 1, "batch_size": 1,
                "gradient_accumulation_steps": 1, "max_iters": 0, "warmup_iters": 0, "lr_decay_iters": 0,
                "threads": 0}
    for key, low in at_least.items():
        if getattr(tc, key) < low:
            raise ConfigError(f"{key}={getattr(tc, key)} must be at least {low}")
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
        value = getattr(tc, key)
        if not value >= 0 or value == float("inf"):  # also catches nan
            raise ConfigError(f"{key}={value} must be a finite number >= 0")
    if tc.decay_lr and tc.min_lr > tc.learning_rate:  # the cosine "decay" would raise the rate
        raise ConfigError(f"min_lr={tc.min_lr} is above learning_rate={tc.learning_rate}; the schedule decays "
                          "from learning_rate to min_lr: lower min_lr (e.g. learning_rate / 10)")
    if tc.learning_rate * tc.weight_decay >= 1:  # AdamW multiplies weights by 1 - lr * wd each step
        raise ConfigError(f"learning_rate * weight_decay = {tc.learning_rate * tc.weight_decay:g} >= 1 would zero "
                          f"or flip the weights every step; {weight_decay_fix(tc.learning_rate)}")
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(tc, key) < 1.0:
            raise ConfigError(f"{key}={getattr(tc, key)} must be in [0, 1) (AdamW's moment decay)")
    if not 0 <= tc.stop_val_acc <= 1:  # also catches nan
        raise ConfigError(f"stop_val_acc={tc.stop_val_acc} must be in [0, 1] (a val accuracy; 0 = never stop early)")
    if not 0 <= tc.seed < 2**32:
        raise ConfigError(f"seed={tc.seed} must be in [0, 2**32)")
    if tc.strategy not in ("ddp", "fsdp"):
        raise ConfigError(f"strategy={tc.strategy!r}; choose ddp or fsdp")
    if tc.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype={tc.dtype!r}; choose auto, float32, bfloat16 or float16")
    if tc.init_from not in ("scratch", "resume", *PRETRAINED) and not os.path.isdir(tc.init_from):
        raise ConfigError(f"init_from={tc.init_from!r}; choose scratch, resume, {', '.join(PRETRAINED)} or a folder "
                          "(a run's out_dir holding ckpt.pt, or GPT-2's config.json and model.safetensors)")
    if os.path.isdir(tc.init_from) and os.path.realpath(tc.init_from) == os.path.realpath(tc.out_dir):
        raise ConfigError(f"init_from and out_dir are the same folder {tc.out_dir}; fine-tune into another "
                          "--out_dir (or continue that run with --init_from=resume)")
    if tc.eval_only and tc.init_from == "scratch":
        raise ConfigError("eval_only=True evaluates a trained model: add --init_from=resume (reads out_dir/ckpt.pt) "
                          "or a pretrained init_from such as gpt2")


def resolve_device(name: str) -> str:
    """auto -> cuda if present else cpu; an unknown or unavailable device is a ConfigError."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("device=mps but MPS (Apple GPU) is not available here; use --device=cpu")
        return name
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if not match:
        raise ConfigError(f"device={name!r}; choose auto, cpu, cuda, cuda:N or mps")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={name} but CUDA is not available; use --device=cpu")
    if match.group(1) is not None and int(match.group(1)) >= torch.cuda.device_count():
        raise ConfigError(f"device={name} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return name


def check_wandb_ready(tc) -> None:
    """wandb_log=True needs wandb and a key (or an offline mode) before any work: wandb.init would
    otherwise stop a started run for an interactive login."""
    if not tc.wandb_log:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("wandb_log=True but wandb is not installed; pip install wandb") from None
    if os.environ.get("WANDB_MODE", "") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    netrc = os.path.expanduser("~/.netrc")
    if os.path.isfile(netrc) and "api.wandb.ai" in open(netrc, errors="replace").read():
        return
    raise ConfigError("wandb_log=True but no wandb API key is set here; run `wandb login` (or set WANDB_API_KEY), "
                      "or log locally with WANDB_MODE=offline")


def memory_bytes(device: str) -> int:
    """The memory a run on device can use at most: the GPU's, or this machine's RAM."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_in_memory(gptconf, tc) -> None:
    """Refuse, before building anything, a run whose lower bound of memory exceeds the device's:
    16 bytes per weight (fp32 weights, gradients, Adam's two moments) for the projections every
    variant has (q and output 2C^2, the MLP 2C*hidden per layer if any; the tied embedding V*C), plus the
    logits and their gradient (B*T*V fp32, twice). A bound, so a refusal is never wrong."""
    C, hidden = gptconf.n_embd, (gptconf.mlp_hidden or 4 * gptconf.n_embd) if gptconf.mlp else 0
    params = gptconf.n_layer * (2 * C * C + 2 * C * hidden) + gptconf.vocab_size * C
    need = 16 * params + 2 * 4 * tc.batch_size * gptconf.block_size * gptconf.vocab_size
    have = memory_bytes(tc.device)
    if need > have:
        raise ConfigError(f"this run does not fit in memory: at least {need / 2**30:,.1f} GiB needed ({params:,} "
                          f"weights x 16 bytes + the logits of batch_size={tc.batch_size}), {have / 2**30:,.1f} GiB "
                          f"on {tc.device}; lower n_layer, n_embd or batch_size")


def resolve_dtype(name: str, device: str) -> str:
    """auto -> bfloat16 on CUDA when supported, else float32: also on CPUs with native bf16 units. There
    bf16 autocast's loss is equivalent to fp32's within 0.01 nats (25 paired seeds), but whether it is
    faster the units do not tell (1.4-1.6x with one thread on one CPU with AVX512-BF16, 0.5-0.8x on another:
    docs/speed.md), so it stays opt-in. Half precision must really run: bfloat16 runs on CPU under
    autocast; float16 needs CUDA (its GradScaler)."""
    device_type = device.split(":")[0]
    if name == "auto":
        return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "float16" and device_type != "cuda":
        raise ConfigError(f"dtype=float16 needs CUDA (device is {device}); use --dtype=bfloat16 or float32")
    return name


def read_meta(data: str) -> dict:
    """data/<dataset>/meta.json, checked: vocab_size a positive int, dtype uint16 or uint32."""
    path = os.path.join(data, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e}); re-run the dataset's prepare script") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int) or meta["vocab_size"] < 1:
        raise ConfigError(f"{path} has no positive integer vocab_size; re-run the dataset's prepare script")
    if meta.get("dtype", "uint16") not in ("uint16", "uint32"):
        raise ConfigError(f"{path} says dtype={meta.get('dtype')!r}; expected uint16 or uint32")
    chars = meta.get("chars")
    if chars is not None and (not isinstance(chars, list) or len(chars) != meta["vocab_size"]):
        raise ConfigError(f"{path}: its chars list has {len(chars) if isinstance(chars, list) else 'no'} entries but "
                          f"vocab_size is {meta['vocab_size']}; re-run the dataset's prepare script")
    return meta


def dataset_identity(meta: dict) -> dict:
    """What makes two datasets' token ids mean the same: the tokenizer and, for characters, which
    character each id is (a hash of the list). A resume on another mapping is refused with it."""
    chars = meta.get("chars")
    digest = hashlib.sha256(json.dumps(chars).encode()).hexdigest()[:16] if chars is not None else None
    return {"tokenizer": meta.get("tokenizer", "char" if chars is not None else None),
            "vocab_size": meta["vocab_size"], "chars_sha256": digest}


def missing_dataset_hint(data_dir: str, dataset: str) -> str:
    """The command that makes data_dir/dataset: its own prepare script, else the generic text one."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root
    target = os.path.join(data_dir, dataset)
    script = os.path.join(here, "data", dataset, "prepare.py")
    if os.path.isfile(script):
        return f"python {os.path.relpath(script)} --out_dir {target}"
    generic = os.path.relpath(os.path.join(here, "data", "text", "prepare.py"))
    return f"python {generic} --input YOUR_TEXT_FILE --out_dir {target}"


def check_data(tc: TrainConfig) -> dict:
    data = os.path.join(tc.data_dir, tc.dataset)
    missing = [f for f in ("train.bin", "val.bin", "meta.json") if not os.path.exists(os.path.join(data, f))]
    if missing:
        raise ConfigError(f"dataset {tc.dataset!r} is missing {', '.join(missing)} in {data}; make it with: "
                          f"{missing_dataset_hint(tc.data_dir, tc.dataset)}")
    folders = [f for f in ("train.bin", "val.bin", "meta.json") if not os.path.isfile(os.path.join(data, f))]
    if folders:  # e.g. a folder named train.bin: the reader would fail on it mid-setup
        raise ConfigError(f"dataset {tc.dataset!r}: {', '.join(folders)} in {data} is not a file (a folder?); "
                          f"remake the dataset with: {missing_dataset_hint(tc.data_dir, tc.dataset)}")
    meta = read_meta(data)
    if tc.stop_val_acc and meta.get("format") != "examples":
        raise ConfigError(f"stop_val_acc={tc.stop_val_acc} needs a dataset of examples with counted targets (e.g. "
                          f"data/mqar/prepare.py); {tc.dataset!r} is text, which has no accuracy: drop stop_val_acc")
    return meta


def train_help(config_files=()) -> str:
    """python train.py [CONFIG_FILE ...] --help: usage, then every key with its type, its value
    (after the config files given, if any) and the comment that defines it, grouped by section."""
    values = parse_keys(list(config_files)) if config_files else {}
    source = f"values after {', '.join(config_files)}" if config_files else "defaults"
    lines = [inspect.getmodule(check_data).__doc__.strip(), "",
             "usage: python train.py [CONFIG_FILE ...] [--key=value ...]",
             "Config files are Python and run when loaded: never load one from an untrusted source.", ""]
    for cls, title in ((TrainConfig, "training keys (trainer/settings.py TrainConfig)"),
                       (GPTConfig, "model keys (model.py GPTConfig)")):
        rows = [(f"--{f.name}={values.get(f.name, f.default)!r}", f.type.__name__, f.name)
                for f in fields(cls) if f.name != "vocab_size"]
        width = max(len(r[0]) for r in rows)
        lines.append(f"{title}, {source}:")
        comments, sections = _field_comments(cls)
        for key, type_name, name in rows:
            if name in sections:
                lines.append(f"  # {sections[name]}")
            lines.append(f"  {key:<{width}}  {type_name:<5}  {comments.get(name, '')}".rstrip())
        lines.append("")
    return "\n".join(lines)


def _field_comments(cls):
    """-> ({name: the comment after its definition, continuation lines joined},
    {name: the section comment just above it}). A continuation line is a comment indented past
    the fields; a comment at the fields' own indent opens a section."""
    comments, sections, last, section = {}, {}, None, None
    for line in inspect.getsource(cls).splitlines():
        field = re.match(r"(\s+)(\w+): [\w|. ]+ = .*?(?:#\s*(.*))?$", line)
        comment = re.match(r"(\s+)#\s*(.*)", line)
        if field:
            last = field.group(2)
            comments[last] = field.group(3) or ""
            if section:
                sections[last], section = section, None
        elif comment and last and len(comment.group(1)) > 4:
            comments[last] += " " + comment.group(2)
        elif comment:
            section, last = comment.group(2), None
        else:
            last = None
    return comments, sections
