"""Evaluate trained runs at other context lengths ("train short, test long").

    python -m tools.eval sweeps/pos/alibi-s1 sweeps/cpu/mha-s1 --lengths=64,128,256,512,1024 --json eval.json

For each run and each length L, the loss over the whole validation split (--split=test: the
held-out test split, from prepare.py --test_fraction) cut into non-overlapping windows of L
tokens (each token predicts the next; batched, with a progress bar). A markdown table (runs x
lengths) goes to stdout and the curves (loss against context length, log x) to --plot (default:
beside --json, its name with .png; without --json, eval.png in the first RUN_DIR).
--rope_scaling=none,pi,ntk,yarn --rope_factor=4 evaluates each RoPE run once per scaling (a row
each, "run [yarn x4]"): a trained model stretched without retraining; other runs are evaluated once,
as trained (a note on stderr names them), and with no RoPE run at all it exits 2. A yarn row's regime
(attention/positional.py, RoPE.yarn_regime: its pairs' turns over the trained length against beta_fast
and beta_slow) is a note line under the table and "yarn_regime" in its JSON rows. Lengths a run cannot take
(learned positions or BigBird beyond block_size) are n/a with the reason; if no requested
length is possible for any run, it exits 2 with one line. --json writes a list of {"run",
"attention", "pos_encoding", "rope_scaling", "rope_factor", "block_size", "length", "val_loss"}
(val_loss null where n/a; "test_loss" with --split=test). A dataset of examples (meta.json
"format": "examples", e.g. data/mqar) is evaluated row by row at its row length, on the counted
targets only, with the accuracy beside the loss ("val_acc" / "test_acc").

Extrapolation measured apart from context (both views together: a model that uses context past
L must beat the second):
  --per_position  the loss of positions [0, L), [L, 2L), [2L, 4L) ... of each window separately
                  (L the run's block_size): the tokens past the training length are not averaged
                  with those that merely lack context; JSON rows gain "buckets" [{"start", "end", "loss"}].
  --stride=S      the sliding-window loss at L: windows every S tokens, each token predicted with
                  at least L - S and up to L tokens before it; one more row per run with "stride": S.
                  S above a run's block_size is refused (exit 2) before any evaluation.
  --window=W      softmax runs (mha, gqa, mqa, swa) also evaluated with a sliding window of W keys on the
                  same weights (attention=swa, sliding_window=W): what restricting a model to W keys costs
                  when it was not trained for it; a row per run, "run [window W]", with "window": W.
Retrieval at these lengths, not loss: python -m tools.passkey (a number hidden in filler, the same flags).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from attention.positional import RoPE
from data.progress import progress
from trainer.checkpoint import (
    CheckpointError,
    model_config_from_checkpoint,
    model_from_checkpoint,
)
from trainer.cli import ConfigError, OneLineParser, check_output, fail
from trainer.rundir import Run
from trainer.settings import resolve_device


def parse_lengths(text):
    try:
        lengths = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        lengths = []
    if not lengths or lengths[0] < 1:
        raise ValueError(f"--lengths={text!r}: give positive integers separated by commas, e.g. --lengths=64,128,256")
    return lengths


def split_tokens(ckpt, run_dir, data_dir=None, split="val"):
    """The run's val or test split (uint16/uint32 memmap) from its data_dir/dataset and meta.json."""
    folder, dataset = split_folder(ckpt, data_dir)
    path = os.path.join(folder, f"{split}.bin")
    if split == "test" and os.path.isdir(folder) and not os.path.isfile(path):
        raise CheckpointError(f"{run_dir}: {dataset} has no test split ({path}); re-run its prepare script with "
                              "--test_fraction=F (e.g. 0.05)")
    if not os.path.isfile(path):
        raise CheckpointError(f"{run_dir}: its {split} split {path} is not there; prepare {dataset} or pass "
                              f"--data_dir=FOLDER holding <dataset>/{split}.bin")
    dtype = (ckpt.get("meta") or {}).get("dtype", "uint16")
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


def split_folder(ckpt, data_dir=None):
    """(folder, dataset name) of the run's data: --data_dir or the run's data_dir, then its dataset."""
    cfg = ckpt.get("config") or {}
    dataset = cfg.get("dataset", "shakespeare_char")
    return os.path.join(data_dir or cfg.get("data_dir", "data"), dataset), dataset


def split_targets(ckpt, run_dir, data_dir=None, split="val"):
    """A dataset of examples: the targets file beside the split's tokens (int32, -1 not counted)."""
    path = os.path.join(split_folder(ckpt, data_dir)[0], f"{split}.targets.bin")
    if not os.path.isfile(path):
        raise CheckpointError(f"{run_dir}: {path} is missing (its meta.json says format=examples); re-run the "
                              "prepare script")
    return np.memmap(path, dtype=np.dtype((ckpt.get("meta") or {}).get("targets_dtype", "int32")), mode="r")


@torch.no_grad()
def examples_loss(model, tokens, targets, row_len, batch_size, device, desc):
    """(mean loss, accuracy) over the counted targets of every row of a dataset of examples."""
    total, hits, count = 0.0, 0, 0
    for starts in batches(range(0, len(tokens) // row_len * row_len, row_len), batch_size, desc):
        x = torch.from_numpy(np.stack([tokens[s:s + row_len] for s in starts]).astype(np.int64)).to(device)
        y = torch.from_numpy(np.stack([targets[s:s + row_len] for s in starts]).astype(np.int64)).to(device)
        logits, _ = model(x)
        counted = y != -1
        total += F.cross_entropy(logits.float()[counted], y[counted], reduction="sum").item()
        hits += int((logits.argmax(-1)[counted] == y[counted]).sum())
        count += int(counted.sum())
    return total / count, hits / count


def why_not(model, length, n_tokens):
    """None if the model can be evaluated on windows of `length` tokens, else the reason."""
    if length > n_tokens - 1:
        return f"the split has {n_tokens} tokens"
    try:
        model.context_window(length)  # the model's own rule: learned positions and BigBird end at block_size
    except ValueError as e:
        return str(e).split(";")[0]
    return None


def batches(starts, batch_size, desc):
    """starts in groups of batch_size, saying how far it is: a bar on a terminal, a plain line every
    few percent in a redirected log (data/progress.py; it was silent there for 44 minutes)."""
    starts = list(starts)
    bar = progress(-(-len(starts) // batch_size), "batch", desc, leave=False)
    try:
        for i in range(0, len(starts), batch_size):
            yield starts[i:i + batch_size]
            bar.update(1)
    finally:
        bar.close()


def window_losses(model, tokens, starts, length, device):
    """Next-token losses (B, length) fp32 of the windows tokens[s:s + length + 1] for s in starts."""
    chunk = np.stack([tokens[s:s + length + 1] for s in starts]).astype(np.int64)
    batch = torch.from_numpy(chunk).to(device)
    logits, _ = model(batch[:, :-1])
    losses = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].reshape(-1), reduction="none")
    return losses.view(len(starts), length)


@torch.no_grad()
def position_sums(model, tokens, length, batch_size, device, desc):
    """Loss summed over non-overlapping windows of `length` covering tokens, per position in the
    window: (length,) float64, and the number of windows."""
    n_windows = (len(tokens) - 1) // length
    sums = torch.zeros(length, dtype=torch.float64)
    for starts in batches(range(0, n_windows * length, length), batch_size, desc):
        sums += window_losses(model, tokens, starts, length, device).double().sum(0).cpu()
    return sums, n_windows


def window_loss(model, tokens, length, batch_size, device, desc):
    """Mean next-token loss over non-overlapping windows of `length` covering tokens."""
    sums, n_windows = position_sums(model, tokens, length, batch_size, device, desc)
    return sums.sum().item() / (n_windows * length)


def position_buckets(block_size, length):
    """Position ranges [0, L), [L, 2L), [2L, 4L) ... up to length, for L = the trained block_size:
    the tokens within the training length apart from those past it, each doubling on its own."""
    edges = [0, block_size]
    while edges[-1] < length:
        edges.append(2 * edges[-1])
    edges = [e for e in edges if e < length] + [length]
    return list(zip(edges, edges[1:]))


def bucket_losses(sums, n_windows, block_size):
    return [{"start": a, "end": b, "loss": sums[a:b].sum().item() / (n_windows * (b - a))}
            for a, b in position_buckets(block_size, len(sums))]


@torch.no_grad()
def strided_loss(model, tokens, length, stride, batch_size, device, desc):
    """Mean loss with every token predicted from up to `length` tokens before it: windows of
    `length` every `stride` tokens; the first window scores all its targets, each later one its
    last `stride` (the ones no earlier window reached), so each target keeps at least
    length - stride tokens of context. The tail after the last whole window is left out."""
    total, count = 0.0, 0
    for starts in batches(range(0, len(tokens) - length, stride), batch_size, desc):
        losses = window_losses(model, tokens, starts, length, device).double()
        scored = torch.full((len(starts), length), False)
        scored[:, length - stride:] = True
        if starts[0] == 0:
            scored[0] = True
        total += losses[scored.to(losses.device)].sum().item()
        count += int(scored.sum())
    return total / count


def run_labels(run_dirs):
    """Folder names, or parent/name where two runs share a name (sweeps/a/mha-s1, sweeps/b/mha-s1)."""
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    return [os.path.join(*os.path.normpath(d).split(os.sep)[-2:]) if names.count(n) > 1 else n
            for d, n in zip(run_dirs, names)]


YARN_FLAGS = ("rope_beta_fast", "rope_beta_slow", "rope_attn_factor")   # model keys, RoPE's fields without rope_


def rope_overrides(args):
    """The RoPE settings to evaluate with, one dict per --rope_scaling value ({} = as trained)."""
    if args.rope_scaling is None:
        return [{}]
    factor = {"rope_factor": args.rope_factor} if args.rope_factor is not None else {}
    yarn = {k: getattr(args, k) for k in YARN_FLAGS if getattr(args, k) is not None}
    unset = {k: getattr(RoPE, k.removeprefix("rope_")) for k in YARN_FLAGS}   # their defaults
    out = []
    for scaling in dict.fromkeys(v.strip() for v in args.rope_scaling.split(",") if v.strip()):
        change = {"rope_scaling": scaling, "rope_factor": 1.0, **unset} if scaling == "none" else \
            {"rope_scaling": scaling, **factor, **(yarn if scaling == "yarn" else unset)}
        out.append(change)
    return out


WINDOWABLE = ("mha", "gqa", "mqa", "swa")   # QKVAttention's softmax variants: swa's mask fits their weights


def check_runs(args):
    """Before any evaluation, for every run: --stride at most its block_size, --window only on softmax
    runs, and --rope_scaling only with a RoPE run among them (ConfigError); -> the runs a scaling leaves
    as trained, for a note."""
    as_trained = []
    for run_dir in args.runs:
        run = Run(run_dir)  # the checkpoint's header only: no weights are read here
        config = model_config_from_checkpoint(run.header(args.ckpt), run.checkpoint_path(args.ckpt))
        if args.stride and args.stride > config.block_size:
            raise ConfigError(f"--stride={args.stride} is above the block_size={config.block_size} of {run_dir}; "
                              "give 1 <= --stride <= the smallest block_size of the runs")
        others = sorted(set(config.attention_plan) - set(WINDOWABLE))
        if getattr(args, "window", None) and others:   # tools.passkey has no --window
            raise ConfigError(f"--window applies to softmax runs ({', '.join(WINDOWABLE)}); {run_dir} has "
                              f"attention={','.join(others)}; leave it out or drop --window")
        if config.pos_encoding != "rope":
            as_trained.append(f"{run_dir} (pos_encoding={config.pos_encoding})")
    if args.rope_scaling is not None and len(as_trained) == len(args.runs):
        raise ConfigError(f"--rope_scaling scales RoPE, and no run uses it: {', '.join(as_trained)}; drop "
                          "--rope_scaling (these positions have no scaling to apply)")
    return as_trained if args.rope_scaling is not None else []


def checked_device(args, done="evaluated"):
    """The device, after check_runs (ConfigError); says which runs a --rope_scaling leaves as trained."""
    device = resolve_device(args.device)
    unscaled = check_runs(args)
    if unscaled:
        print(f"note: --rope_scaling applies to RoPE runs only; {done} once, as trained: {', '.join(unscaled)}",
              file=sys.stderr)
    return device


def evaluate_run(run_dir, name, lengths, args, device):
    """Rows of one run (loss None and a 'why' where the length is not possible), per RoPE setting."""
    run = Run(run_dir)
    path, ckpt = run.checkpoint_path(args.ckpt), run.checkpoint(args.ckpt, device)
    tokens = split_tokens(ckpt, run_dir, args.data_dir, args.split)
    if args.max_tokens:
        tokens = tokens[:args.max_tokens]
    if (ckpt.get("meta") or {}).get("format") == "examples":
        return evaluate_examples(ckpt, path, tokens, run_dir, name, lengths, args, device)
    rows = []
    for model, label, extra in scaled_models(ckpt, path, name, args, device):
        config, row = model.config, {**row_head(label, model.config), **regime_key(model), **extra}  # yarn: its regime
        for length in lengths:
            reason, buckets = why_not(model, length, len(tokens)), None
            if reason:
                loss = None
            else:
                sums, n = position_sums(model, tokens, length, args.batch_size, device, f"{label} L={length}")
                loss = sums.sum().item() / (n * length)
                buckets = bucket_losses(sums, n, config.block_size)
            rows.append({**row, "length": length, "loss": loss, "why": reason,
                         **({"buckets": buckets} if args.per_position else {})})
        if args.stride:
            L = config.block_size
            reason = why_not(model, L, len(tokens))  # a stride above block_size was refused by check_runs
            loss = None if reason else strided_loss(model, tokens, L, args.stride, args.batch_size, device,
                                                    f"{label} stride {args.stride}")
            rows.append({**row, "length": L, "stride": args.stride, "loss": loss, "why": reason})
    return rows


def scaled_models(ckpt, path, name, args, device):
    """(model, row label, extra row keys) per RoPE setting of --rope_scaling (a scaling applies to RoPE
    runs only; the others are evaluated once, as trained, under the run's name), each followed with
    --window by the same weights under a sliding window of W keys ({"window": W})."""
    trained, window = model_config_from_checkpoint(ckpt, path), getattr(args, "window", None)
    for change in rope_overrides(args) if trained.pos_encoding == "rope" else [{}]:
        label = name + (f" [{scaling_label(model_config_from_checkpoint(ckpt, path, **change))}]" if change else "")
        for w in [None, window] if window else [None]:
            swa = {"attention": "swa", "sliding_window": w} if w else {}
            model = model_from_checkpoint(ckpt, model_config_from_checkpoint(ckpt, path, **change, **swa), path, device)
            yield model, label + (f" [window {w}]" if w else ""), ({"window": w} if w else {})


def regime_key(model):
    """{"yarn_regime": RoPE.yarn_regime of the first RoPE layer} for a model stretched by yarn, else {}."""
    if model.config.rope_scaling != "yarn":
        return {}
    i, attn = next((i, b.attn) for i, b in enumerate(model.h) if getattr(b.attn, "rotary", None))
    return {"yarn_regime": attn.rotary.yarn_regime(type(attn).rope_dim(model.config.layer_config(i)))}


def regime_text(r):
    """One line for a yarn_regime: the turns against the betas, the bands by turns and as the ramp computes them."""
    t, k, n = r["by_turns"], r["by_ramp"], r["rotated_dims"] // 2
    side = ">" if r["turns_fastest"] > r["beta_fast"] else "<="
    return (f"L={r['context']}: fastest pair {r['turns_fastest']:.1f} turns ({side} beta_fast={r['beta_fast']:g}), "
            f"slowest {r['turns_slowest']:.2g} (beta_slow={r['beta_slow']:g}): "
            f"{r['regime']}; of {n} pairs, by turns {t['above_beta_fast']} above beta_fast, {t['between']} between, "
            f"{t['below_beta_slow']} below beta_slow; the ramp keeps {k['kept']}, ramps {k['ramped']}, "
            f"interpolates {k['interpolated']}")


def regime_notes(rows):
    """A note line per run stretched by yarn: its regime (RoPE.yarn_regime), to read beside its row."""
    notes = dict.fromkeys(f"yarn regime of {r['run']}: {regime_text(r['yarn_regime'])}"
                          for r in rows if r.get("yarn_regime"))
    return "".join(f"{line}\n" for line in notes)


def evaluate_examples(ckpt, path, tokens, run_dir, name, lengths, args, device):
    """A dataset of examples: rows of row_len tokens, loss and accuracy on the counted targets; other
    lengths are n/a (an example is one row)."""
    row_len = ckpt["meta"]["row_len"]
    targets = split_targets(ckpt, run_dir, args.data_dir, args.split)[:len(tokens)]
    model = model_from_checkpoint(ckpt, model_config_from_checkpoint(ckpt, path), path, device)
    rows = []
    for length in lengths:
        reason = None if length == row_len else f"examples are rows of {row_len} tokens"
        loss, acc = (None, None) if reason else examples_loss(model, tokens, targets, row_len, args.batch_size,
                                                              device, f"{name} examples")
        rows.append({**row_head(name, model.config), "length": length, "loss": loss, "acc": acc, "why": reason})
    return rows


def row_head(label, config):
    """What every row of one run and setting starts with."""
    return {"run": label, "attention": config.attention, "pos_encoding": config.pos_encoding,
            "rope_scaling": config.rope_scaling, "rope_factor": config.rope_factor, "block_size": config.block_size}


def scaling_label(config):
    return "none" if config.rope_scaling == "none" else f"{config.rope_scaling} x{config.rope_factor:g}"


def markdown_table(rows, lengths, stride=None):
    """Runs x lengths (non-overlapping windows), then with --stride a column of the sliding-window
    loss at each run's block_size; n/a cells point to their reason under the table."""
    runs = list(dict.fromkeys(r["run"] for r in rows))
    by_key = {(r["run"], "stride" if "stride" in r else r["length"]): r for r in rows}
    reasons = list(dict.fromkeys(r["why"] for r in rows if r["why"]))
    keys = [*lengths, *(["stride"] if stride else [])]

    def cell(r):
        if r["loss"] is None:
            return f"n/a ({reasons.index(r['why']) + 1})"
        return f"{r['loss']:.4f}" + (f" (acc {r['acc']:.3f})" if r.get("acc") is not None else "")
    heads = [f"L={n}" for n in lengths] + ([f"L=block_size, stride {stride}"] if stride else [])
    lines = ["| run | attention | pos | block_size | " + " | ".join(heads) + " |",
             "|---|---|---|---|" + "---|" * len(keys)]
    for run in runs:
        first = by_key[(run, lengths[0])]
        lines.append(f"| {run} | {first['attention']} | {first['pos_encoding']} | {first['block_size']} | "
                     + " | ".join(cell(by_key[(run, k)]) for k in keys) + " |")
    lines += [""] + [f"({i}) {why}" for i, why in enumerate(reasons, 1)]
    return "\n".join(lines) + "\n"


def position_table(rows):
    """--per_position: per run and length, the loss of the positions in each bucket."""
    lines = ["| run | L | loss by position: [start, end) loss |", "|---|---|---|"]
    for r in rows:
        if r.get("buckets"):
            cells = "; ".join(f"[{b['start']}, {b['end']}) {b['loss']:.4f}" for b in r["buckets"])
            lines.append(f"| {r['run']} | {r['length']} | {cells} |")
    return "\n".join(lines) + "\n"


def plot(rows, path, split="val"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in dict.fromkeys(r["run"] for r in rows):
        pts = [(r["length"], r["loss"]) for r in rows if r["run"] == run and r["loss"] is not None]
        if pts:
            r0 = next(r for r in rows if r["run"] == run)
            ax.plot(*zip(*pts), marker="o", label=f"{run} ({r0['attention']}, {r0['pos_encoding']}, "
                                                  f"trained at {r0['block_size']})")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="evaluation context length (tokens)", ylabel=f"{split} loss",
           title="loss against context length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_rope_flags(ap):
    ap.add_argument("--rope_scaling", help="RoPE runs: evaluate with these scalings instead of the trained one, "
                    "comma-separated from none, pi, ntk, yarn (one row each); no retraining")
    ap.add_argument("--rope_factor", type=float, help="with --rope_scaling: the extension factor (e.g. 4)")
    ap.add_argument("--rope_beta_fast", type=float, help="yarn: see model.py (default 32)")
    ap.add_argument("--rope_beta_slow", type=float, help="yarn: see model.py (default 1)")
    ap.add_argument("--rope_attn_factor", type=float, help="yarn: cos/sin multiplier (default 0.1 ln(factor) + 1)")


def check_rope_flags(args):
    if args.rope_scaling is None and any(getattr(args, k) is not None for k in ("rope_factor", *YARN_FLAGS)):
        fail("--rope_factor and the yarn flags go with --rope_scaling=pi|ntk|yarn; add it")


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.eval", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="train.py out_dirs")
    ap.add_argument("--lengths", default="64,128,256,512", help="comma-separated context lengths")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--plot", help="where the loss-vs-length plot goes (default: beside --json as .png, "
                    "else RUN_DIR/eval.png of the first run)")
    ap.add_argument("--batch_size", type=int, default=8, help="windows per forward pass")
    ap.add_argument("--ckpt", default="best", help="best (best.pt when present) or last (ckpt.pt)")
    ap.add_argument("--split", default="val", choices=("val", "test"),
                    help="val, or test (the held-out split a study reports on; prepare.py --test_fraction)")
    ap.add_argument("--data_dir", help="folder holding <dataset>/val.bin (default: the run's data_dir)")
    ap.add_argument("--max_tokens", type=int, help="evaluate only the first N tokens of the split")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--per_position", action="store_true",
                    help="also the loss of positions [0, L), [L, 2L), [2L, 4L) ... of each window (L = block_size)")
    ap.add_argument("--stride", type=int, help="also the sliding-window loss at each run's block_size: windows "
                    "every S tokens, each token predicted from up to block_size tokens (1 <= S <= block_size)")
    ap.add_argument("--window", type=int, help="softmax runs: also evaluated with a sliding window of W keys on "
                    "the same weights (attention=swa), a row each")
    add_rope_flags(ap)
    args = ap.parse_args(argv)
    check_output(args.json, "--json")
    if args.plot is None:  # with the outputs, never in the working folder
        args.plot = (os.path.splitext(args.json)[0] + ".png") if args.json else os.path.join(args.runs[0], "eval.png")
    check_output(args.plot, "--plot")
    check_rope_flags(args)
    try:
        lengths = parse_lengths(args.lengths)
    except ValueError as e:
        fail(str(e))
    if args.batch_size < 1:
        fail(f"--batch_size={args.batch_size} must be at least 1")
    if args.stride is not None and args.stride < 1:
        fail(f"--stride={args.stride} must be at least 1 (and at most the runs' block_size)")
    if args.window is not None and args.window < 1:
        fail(f"--window={args.window} must be at least 1 (the keys each query sees, itself included)")
    if args.max_tokens is not None and args.max_tokens < 2:
        fail(f"--max_tokens={args.max_tokens} must be at least 2 (a window needs a token and its next)")
    rows = []
    try:
        device = checked_device(args)
        for run_dir, name in zip(args.runs, run_labels(args.runs)):
            rows += evaluate_run(run_dir, name, lengths, args, device)
    except (CheckpointError, ConfigError) as e:
        fail(str(e))
    if all(r["loss"] is None for r in rows):
        reasons = "; ".join(dict.fromkeys(f"{r['run']}: {r['why']}" for r in rows))
        fail(f"none of --lengths={','.join(map(str, lengths))} is possible for any run ({reasons}); "
             "pick lengths up to the runs' block_size")
    text = markdown_table(rows, lengths, args.stride) + regime_notes(rows)
    if args.per_position:
        text += "\n" + position_table(rows)
    print(text, end="")
    plot([r for r in rows if "stride" not in r], args.plot, args.split)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{({"loss": f"{args.split}_loss", "acc": f"{args.split}_acc"}.get(k, k)): v
                        for k, v in r.items() if k != "why"} for r in rows], f, indent=2)
    print(f"wrote {args.plot}" + (f" and {args.json}" if args.json else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
