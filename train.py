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

Read top to bottom: main() loads and checks the settings (trainer/startup.py), takes the run's
lock, then run() sets up the ranks and the model (trainer/build.py), trains (trainer/loop.py:
Trainer and train_loop) and turns how the run ended into the exit status.
"""
import os
import sys

import torch

from trainer.allocator import keep_freed_memory
from trainer.build import setup_distributed
from trainer.checkpoint import CheckpointError, WriteError, remove_stale_tmp
from trainer.cli import ConfigError, fail
from trainer.loop import Trainer, open_run_files, train_loop
from trainer.runfiles import NonFinite, RunLock, StopSignals
from trainer.settings import train_help
from trainer.startup import load_settings
from trainer.threads import use_cpu_threads


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
    if "RANK" in os.environ:  # a torchrun rank: its files are closed and its process group destroyed
        # Leave without the interpreter's teardown: there, on a loaded CPU, a Gloo thread still joinable
        # at exit now and then aborts a rank whose run has finished (std::terminate, SIGABRT, torchrun exit 1).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def run(tc, gptconf, meta, flat_cfg, checkpoint, signals, config_files=()):
    """Train (or evaluate); returns the exit status (0, 3 or 128 + signal)."""
    dist = setup_distributed(tc)
    threads, why = use_cpu_threads(tc.threads, dist.device)
    if dist.device.startswith("cpu"):
        allocator = keep_freed_memory()  # a step reuses the last one's memory (trainer/allocator.py)
        if dist.master:
            print(f"cpu threads: {threads} ({why}); allocator: {allocator}")
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
