"""Checkpoints: the one place that writes them and reads them back.

Writing is atomic (temporary file, fsync, rename, fsync of the folder), so a crash or a
kill at any moment leaves either the old file or the new one. Reading goes through
PyTorch's weights-only loader (a file that carries code is refused, its code never runs)
and turns every way a file can be wrong into one CheckpointError line that names the
file and the fix; train.py, sample.py and the analysis tools print it and exit 2.
"""
import os
import pickle
import shutil
import warnings
import zipfile

import torch

REQUIRED_KEYS = ("model", "model_args")


class CheckpointError(ValueError):
    pass


def fsync_dir(path):
    """Make a rename in this folder durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class WriteError(OSError):
    """A file could not be written (disk full, read-only folder): the old file is kept."""


def save_atomic(obj, path, writer=torch.save):
    """writer(obj, tmp) then rename tmp -> path: never a half-written `path`. On failure the tmp
    file goes, `path` keeps its last good version, and WriteError says why in one line."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            writer(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        if os.path.exists(tmp):
            os.remove(tmp)
        folder = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
        why = e.strerror if isinstance(e, OSError) and e.strerror else \
            "the disk is full" if free < 2**20 else str(e).splitlines()[0][:80]
        raise WriteError(f"cannot write {path} ({why}; {free / 2**20:,.0f} MiB free there); the previous "
                         f"version is kept: free space or pick another out_dir") from None
    fsync_dir(os.path.dirname(path))


# The files train.py writes as NAME.tmp first, then renames: the only .tmp files it removes.
RUN_FILES = ("ckpt.pt", "best.pt", "summary.json", "log.jsonl", "train.lock")


def remove_stale_tmp(folder):
    """Delete the temporary files of RUN_FILES that a killed run left behind (never loadable);
    every other file in the folder, a user's notes.tmp too, is left alone."""
    stale = [name + ".tmp" for name in RUN_FILES if os.path.isfile(os.path.join(folder, name + ".tmp"))]
    for name in stale:
        os.remove(os.path.join(folder, name))
    return stale


def load_checkpoint(path, device="cpu", required=REQUIRED_KEYS) -> dict:
    """torch.load(path, weights_only=True) with one-line errors for every bad file."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} not found; train first (python train.py config/gqa.py) "
                              "or point --out_dir at a run folder")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes); delete it and resume from another "
                              "checkpoint or train again")
    try:
        with warnings.catch_warnings():  # the loader's own warnings would break the one-line error
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # the weights-only loader met a reference to code (a function or class)
            raise CheckpointError(f"checkpoint {path} was refused by the weights-only loader: it refers to "
                                  "code that loading would run (nothing was run); only load files you trust "
                                  "with another tool") from None
        raise CheckpointError(f"checkpoint {path} is not a PyTorch checkpoint (unpickling failed); "
                              "it may be truncated or another kind of file") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, AttributeError, KeyError,
            IndexError, TypeError) as e:  # a text file named ckpt.pt reads as a pickle of nonsense
        why = str(e).splitlines()[0][:120] if str(e) and not isinstance(e, (KeyError, IndexError, TypeError)) \
            else f"{type(e).__name__} while reading it"
        raise CheckpointError(f"checkpoint {path} is truncated or not a checkpoint ({why}); "
                              "delete it and resume from another checkpoint or train again") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(ckpt).__name__}, not a train.py checkpoint")
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}; it was not written by train.py")
    check_checkpoint_values(ckpt, path)
    return ckpt


def check_checkpoint_values(ckpt, path):
    """The fields a run reads have their types, and the weights are finite (a model with a NaN
    weight gives NaN logits: sampling would crash, training would run a step on it)."""
    for key, types in (("iter_num", (int,)), ("best_val_loss", (int, float))):
        if key in ckpt and (isinstance(ckpt[key], bool) or not isinstance(ckpt[key], types)):
            raise CheckpointError(f"checkpoint {path}: {key}={ckpt[key]!r} is not a number; it was edited or not "
                                  "written by train.py")
    if ckpt.get("iter_num", 0) < 0:  # a resume would train iterations -5, -4, ...
        raise CheckpointError(f"checkpoint {path}: iter_num={ckpt['iter_num']} is negative; it was edited or not "
                              "written by train.py")
    best = ckpt.get("best_val_loss", 0.0)
    if not best >= 0:  # a cross-entropy is >= 0; NaN would never compare better, and best.pt never be rewritten
        raise CheckpointError(f"checkpoint {path}: best_val_loss={best!r} is not a loss (NaN or below 0); it was "
                              "edited or not written by train.py")
    weights = ckpt.get("model")
    if weights is None:
        return
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise CheckpointError(f"checkpoint {path}: its model weights are not a dict of tensors; it was not "
                              "written by train.py")
    bad = next((name for name, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad:
        raise CheckpointError(f"checkpoint {path} holds non-finite weights ({bad} has NaN or inf); use an earlier "
                              "checkpoint (best.pt, or a run's ckpt.pt before it diverged) or train again")


def model_config_from_checkpoint(ckpt, path="checkpoint", **overrides):
    """GPTConfig from ckpt['model_args'] (plus overrides such as attn_impl); one-line errors."""
    from model import GPTConfig
    args = ckpt["model_args"]
    if not isinstance(args, dict):
        raise CheckpointError(f"{path}: model_args is not a dict; it was not written by train.py")
    try:
        return GPTConfig.from_dict({**args, **overrides})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: its model config is not valid here ({e})") from None


def load_model(path, device="cpu", **overrides):
    """(GPT with the checkpoint's weights, in eval mode on device, checkpoint dict)."""
    ckpt = load_checkpoint(path, device)
    return model_from_checkpoint(ckpt, model_config_from_checkpoint(ckpt, path, **overrides), path, device), ckpt


def model_from_checkpoint(ckpt, config, path="checkpoint", device="cpu"):
    """GPT(config) holding ckpt's weights, in eval mode on device; one-line error if they do not fit."""
    from model import GPT
    model = GPT(config)
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        why = " ".join(lines[:2])[:200]  # torch's first line only says "Error(s) in loading state_dict"
        raise CheckpointError(f"{path}: weights do not fit its model config ({why})") from None
    return model.eval().to(device)


def is_run_folder(path) -> bool:
    """A folder train.py wrote (init_from=PATH fine-tunes it), as opposed to a GPT-2 folder."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "ckpt.pt"))


def run_checkpoint_path(out_dir, which="best"):
    """out_dir/best.pt or ckpt.pt: which='last' is ckpt.pt, 'best' is best.pt when it exists."""
    if which not in ("best", "last"):
        raise CheckpointError(f"--ckpt={which!r}; choose best or last")
    best = os.path.join(out_dir, "best.pt")
    if which == "best" and os.path.isfile(best):
        return best
    return os.path.join(out_dir, "ckpt.pt")
