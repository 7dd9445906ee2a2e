"""The run folder (out_dir): the one reader and writer of its records, log.jsonl and summary.json.

    log.jsonl      one metrics dict per evaluation (train.py's Trainer.metrics), a JSON line each;
                   a line torn by a kill is skipped here, the one place that tolerates it
    summary.json   the run as a whole, rewritten atomically at every evaluation; strict JSON
                   (NaN and inf become null); its "last_eval" is the last log.jsonl record

train.py writes through these functions; tools/ (compare, sweep, benchmarks) read through them.
Checkpoints (ckpt.pt, best.pt) are trainer/checkpoint.py's, the lock is trainer/runfiles.py's.
"""
import json
import math
import os

from trainer.checkpoint import WriteError, save_atomic

LOG, SUMMARY = "log.jsonl", "summary.json"


class RunError(ValueError):
    """A run folder that cannot be read as one (one line, for the caller to print)."""


def strict(value):
    """NaN and inf -> None, recursively: JSON that every parser reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def write_text_atomic(text, path):
    save_atomic(text, path, writer=lambda t, f: f.write(t.encode()))


def write_json_atomic(obj, path):
    write_text_atomic(json.dumps(strict(obj), indent=2, allow_nan=False) + "\n", path)


def read_log(run_dir) -> list:
    """log.jsonl's records (dicts), in order; [] when there is none. A torn line is skipped."""
    path = os.path.join(run_dir, LOG)
    records = []
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line torn by a kill
                if isinstance(record, dict):
                    records.append(record)
    return records


def open_log(run_dir, resume_iter=None):
    """log.jsonl for appending: on a resume (resume_iter = the checkpoint's iteration) cut back
    to it first, dropping records a kill left past the checkpoint; else started afresh."""
    path = os.path.join(run_dir, LOG)
    if resume_iter is None:
        return open(path, "w")
    kept = [r for r in read_log(run_dir) if r.get("iter", math.inf) <= resume_iter]
    write_text_atomic("".join(json.dumps(r) + "\n" for r in kept), path)
    return open(path, "a")


def append_log(log_file, metrics: dict):
    try:
        log_file.write(json.dumps(strict(metrics)) + "\n")
        log_file.flush()
    except OSError as e:
        raise WriteError(f"cannot append to {log_file.name} ({e.strerror}); free space or pick another "
                         "out_dir") from None


def write_summary(run_dir, summary: dict):
    write_json_atomic(summary, os.path.join(run_dir, SUMMARY))


def read_summary(run_dir) -> dict:
    """summary.json as a dict; RunError (one line) when missing or not a JSON object."""
    path = os.path.join(run_dir, SUMMARY)
    if not os.path.isfile(path):
        raise RunError(f"{path} not found; is {run_dir} a train.py out_dir that has reached an evaluation?")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (ValueError, OSError) as e:
        raise RunError(f"{path} is not valid JSON ({e}); re-run or resume that run") from None
    if not isinstance(summary, dict):
        raise RunError(f"{path} holds a {type(summary).__name__}, not a train.py summary; re-run that run")
    return summary


NUMBERS = ("iter", "train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_s", "flops", "params",
           "best_val_loss", "final_val_loss", "iters", "wall_s", "train_flops", "peak_mem_bytes")


def check_numbers(record, where):
    """The numeric fields a report reads are numbers (or null): RunError naming the first that is not."""
    for key in NUMBERS:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RunError(f"{where}: {key}={value!r} is not a number; the file was edited or not written by "
                           "train.py: re-run that run")
        if isinstance(value, float) and not math.isfinite(value):  # train.py writes null for these
            raise RunError(f"{where}: {key}={value} is not finite (train.py writes null there); the file was edited "
                           "or not written by train.py: re-run that run")
        if key.endswith("loss") and value is not None and value < 0:  # a cross-entropy is >= 0
            raise RunError(f"{where}: {key}={value} is below 0, not a loss; the file was edited or not written by "
                           "train.py: re-run that run")


def load_run(run_dir):
    """(name, summary, log) of one run folder; RunError if its summary or log cannot be read."""
    summary, log = read_summary(run_dir), read_log(run_dir)
    check_numbers(summary, os.path.join(run_dir, SUMMARY))
    for record in log:
        check_numbers(record, os.path.join(run_dir, LOG))
    return os.path.basename(os.path.normpath(run_dir)), summary, log


def run_state(run_dir) -> str:
    """'finished' (summary.json says so, or has no 'finished' key: older train.py wrote it only
    at the end), 'resume' (a checkpoint to continue from) or 'scratch'."""
    try:
        if read_summary(run_dir).get("finished", True):
            return "finished"
    except RunError:
        pass  # none yet, or torn: the run did not finish cleanly
    return "resume" if os.path.isfile(os.path.join(run_dir, "ckpt.pt")) else "scratch"


# Keys that may differ between runs of one config (where they run, what they are called, how many
# threads): every other key of summary.json's "settings" is the experiment.
SETTINGS_EXEMPT = ("seed", "out_dir", "init_from", "overwrite", "wandb_run_name", "wandb_group", "threads",
                   "device", "compile", "backend")


def settings_differ(a: dict, b: dict, exempt=SETTINGS_EXEMPT) -> list:
    """['key: a vs b', ...] for the keys two runs' settings disagree on, beyond the exempt ones."""
    keys = sorted((set(a) | set(b)) - set(exempt))
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
