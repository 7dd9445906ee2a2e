"""The run folder (out_dir): the one reader and writer of its records, log.jsonl and summary.json,
and the one reader every tool goes through (Run).

    log.jsonl       one metrics dict per evaluation (Trainer.metrics, trainer/loop.py), a JSON line each;
                    a line torn by a kill is skipped here, the one place that tolerates it
    summary.json    the run as a whole, rewritten atomically at every evaluation; strict JSON
                    (NaN and inf become null); its "last_eval" is the last log.jsonl record
    test_eval.json  tools.eval --split=test of best.pt, written by tools.sweep (optional)
    reach.json      the pairs a content-chosen pattern (MoBA) reached on the test rows, as tools.recall
                    observed them on best.pt: kept so that a folder stored without checkpoints has them
    best.pt,        the checkpoints (trainer/checkpoint.py writes and checks them): Run.header reads one
    ckpt.pt         without its weights (memory-mapped, none read); Run.checkpoint, Run.load_model with them

train.py writes through these functions; tools/ read a run through Run(path). The lock is
trainer/runfiles.py's.
"""
import functools
import json
import math
import os
import warnings

import torch

from trainer.checkpoint import (
    REQUIRED_KEYS,
    WriteError,
    check_checkpoint_values,
    load_checkpoint,
    load_model,
    run_checkpoint_path,
    save_atomic,
)

LOG, SUMMARY, TEST_EVAL, REACH = "log.jsonl", "summary.json", "test_eval.json", "reach.json"
WEIGHTS = ("model", "optimizer")   # what Run.header leaves out


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


def read_test_eval(run_dir) -> dict:
    """{"test_loss", and "test_acc" for examples} of test_eval.json (tools.eval's rows, the first with a
    test loss); {} when there is none; RunError when it is not tools.eval's JSON."""
    path = os.path.join(run_dir, TEST_EVAL)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            rows = [r for r in json.load(f) if r.get("test_loss") is not None]
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise RunError(f"{path} is not tools.eval's JSON ({e}); delete it and re-run the sweep") from None
    if not rows:
        return {"test_loss": None}
    return {"test_loss": rows[0]["test_loss"], **({"test_acc": rows[0].get("test_acc")} if "test_acc" in rows[0]
                                                   else {})}


def read_header(path) -> dict:
    """A checkpoint without its weights (model_args, config, meta, iter_num, ...): loaded memory-mapped,
    so no weight is read. A file the mapped load refuses (an old format, a bad file) goes through
    load_checkpoint, which reads it whole or says in one line why not (CheckpointError)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 (the checked loader below names the problem)
        ckpt = None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED_KEYS):
        ckpt = load_checkpoint(path)
    header = {k: v for k, v in ckpt.items() if k not in WEIGHTS}
    check_checkpoint_values(header, path)
    return header


class Run:
    """One run folder, read lazily and each file once: .summary, .log, .test_eval, .results (summary
    plus test results), .header(which) / .model_args / .config / .meta (a checkpoint without its
    weights), .checkpoint(which, device) (with them) and .load_model(device, which, **overrides).
    RunError or CheckpointError (one line) on a bad file."""

    def __init__(self, path):
        self.path = str(path)
        self.name = os.path.basename(os.path.normpath(self.path))
        self._headers = {}

    @functools.cached_property
    def summary(self) -> dict:
        summary = read_summary(self.path)
        check_numbers(summary, os.path.join(self.path, SUMMARY))
        return summary

    @functools.cached_property
    def log(self) -> list:
        log = read_log(self.path)
        for record in log:
            check_numbers(record, os.path.join(self.path, LOG))
        return log

    @functools.cached_property
    def test_eval(self) -> dict:
        return read_test_eval(self.path)

    @property
    def results(self) -> dict:
        """summary.json with test_loss (and test_acc) of test_eval.json where the sweep wrote one."""
        return {**self.summary, **self.test_eval}

    def checkpoint_path(self, which="best"):
        return run_checkpoint_path(self.path, which)

    def header(self, which="best") -> dict:
        """best.pt (else ckpt.pt) or ckpt.pt (which="last") without its weights, read once."""
        if which not in self._headers:
            self._headers[which] = read_header(self.checkpoint_path(which))
        return self._headers[which]

    @property
    def model_args(self) -> dict:
        return self.header()["model_args"]

    @property
    def config(self) -> dict:
        """The train config the run was made with ({} from a checkpoint without one)."""
        return self.header().get("config") or {}

    @property
    def meta(self) -> dict:
        """The dataset's meta.json as the run saw it ({} where the checkpoint has none)."""
        return self.header().get("meta") or {}

    def checkpoint(self, which="best", device="cpu") -> dict:
        """The whole checkpoint, weights too, checked (trainer.checkpoint.load_checkpoint)."""
        return load_checkpoint(self.checkpoint_path(which), device)

    def load_model(self, device="cpu", which="best", **overrides):
        """(GPT with the weights of best.pt (else ckpt.pt) or ckpt.pt (which="last"), in eval mode on
        device, the checkpoint dict), as trainer.checkpoint.load_model."""
        return load_model(self.checkpoint_path(which), device, **overrides)


def load_run(run_dir):
    """(name, results, log) of one run folder (Run's, as a tuple for the reports that group them)."""
    run = Run(run_dir)
    return run.name, run.results, run.log


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
# threads, the chunk length of an exact chunked form: the same math, rounded otherwise, as threads
# round otherwise): every other key of summary.json's "settings" is the experiment.
SETTINGS_EXEMPT = ("seed", "out_dir", "init_from", "overwrite", "wandb_run_name", "wandb_group", "threads",
                   "device", "compile", "backend", "delta_chunk", "gla_chunk")


def settings_differ(a: dict, b: dict, exempt=SETTINGS_EXEMPT) -> list:
    """['key: a vs b', ...] for the keys two runs' settings disagree on, beyond the exempt ones and
    the keys owned by attention variants neither run uses (an mha run is the same run whatever the
    default of delta_conv, which only the delta rule reads)."""
    from attention import key_owners  # imports every variant: only when settings are compared
    used = {name.strip() for s in (a, b) for name in str(s.get("attention", "")).split(",")}
    unread = {k for k, owners in key_owners().items() if not used & set(owners)}
    keys = sorted((set(a) | set(b)) - set(exempt) - unread)
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
