"""Everything train.py checks before any work: the command line, the data, and the checkpoint a
run starts from (resume or fine-tune), read once. Bad input raises ConfigError (train.py exits 2)."""
import os
import sys

from attention import check_impl_runs_on, variant_class
from model import GPTConfig
from pretrained import overrides_from_keys, pretrained_config
from trainer.batches import check_token_files
from trainer.checkpoint import is_run_folder, load_checkpoint, model_config_from_checkpoint
from trainer.cli import ConfigError
from trainer.runfiles import RunLock
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
)

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
    saved = model_config_from_checkpoint(ckpt, path, **{k: getattr(gptconf, k) for k in RESUME_MAY_CHANGE})
    differ = [f"{k}={getattr(gptconf, k)!r} (checkpoint: {getattr(saved, k)!r})" for k in sorted(explicit)
              if k in MODEL_KEYS and k not in RESUME_MAY_CHANGE and getattr(gptconf, k) != getattr(saved, k)]
    if differ:
        raise ConfigError(f"resume: {', '.join(differ)} differ from {path}; drop them or train a new out_dir")
    if saved.vocab_size != gptconf.vocab_size:
        raise ConfigError(f"resume: {path} has vocab_size={saved.vocab_size} but dataset {tc.dataset!r} has "
                          f"{gptconf.vocab_size}; resume on the dataset it was trained on")
    if "dtype" not in explicit and ckpt.get("dtype") in ("float32", "bfloat16", "float16"):
        # dtype=auto depends on the machine: a run resumed elsewhere keeps the precision it trained in
        tc.dtype = resolve_dtype(ckpt["dtype"], tc.device)   # float16 off CUDA: refused here, one line
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
