"""What every benchmark shares: its command line (--json, --out, --quick), one timing helper,
a time budget that skips what does not fit, peak-memory measurement, output writing, and
a table of train.py run folders (read through trainer.rundir.Run).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from trainer.cli import OneLineParser, check_output, positive_float


class SuiteParser(OneLineParser):
    """One-line errors, and --json / --out checked writable before the suite runs."""

    def parse_args(self, *args, **kwargs):
        parsed = super().parse_args(*args, **kwargs)
        check_output(parsed.json, "--json")
        check_output(parsed.out, "--out")
        return parsed


def parser(doc, out=None, quick="tiny sizes: a smoke test of the script itself"):
    """argparse with the suite's whole docstring as help and the common flags."""
    p = SuiteParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="also write the results as JSON")
    p.add_argument("--out", default=out, help="also write the markdown to this file")
    if quick:
        p.add_argument("--quick", action="store_true", help=quick)
    return p


@contextlib.contextmanager
def compiling(models):
    """Room for `models` models compiled in one process, each timed as compiled. torch._dynamo keeps its
    compiled entries per code object (GPT.forward, Block.forward, ...), so every model of the same classes
    counts against one recompile_limit (8), and past it a frame runs eagerly without an error: a suite's
    later "compiled" models would be timed eager. Inside: empty caches (no entry compiled under another
    setting's thread count, which Inductor's CPU kernels bake in), 8 entries per model, and hitting the
    limit raises instead of falling back."""
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=8 * models, fail_on_recompile_limit_hit=True):
            yield
    finally:
        torch._dynamo.reset()


# argparse types: a bad number is one line naming its flag (argparse adds "argument --flag: "), exit 2,
# before any timing
def at_least(lowest):
    """A whole number >= lowest."""
    def whole_number(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"{value} must be at least {lowest}")
        return value
    return whole_number


def counts(text):
    """Comma-separated whole numbers >= 1 (lengths, contexts, head dims), kept as the text int_list reads."""
    try:
        values = int_list(text)
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated whole numbers of at least 1, e.g. 256,4096")
    return text


def positive_floats(text):
    """Comma-separated numbers > 0, kept as the text."""
    try:
        for x in text.split(","):
            positive_float(x)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated numbers above 0, e.g. 0.05,2,30") from None
    return text


def add_kernel_shape_args(p, heads, budget_s):
    """The shape flags of the kernel suites (batch, heads, lengths, head dims, time budget)."""
    p.add_argument("--batch", type=at_least(1), default=4)
    p.add_argument("--heads", type=at_least(1), default=heads)
    p.add_argument("--seqlens", type=counts, default="1024,2048,4096,8192,16384")
    p.add_argument("--head_dims", type=counts, default="64,128")
    p.add_argument("--budget_s", type=positive_float, default=budget_s, help="skip remaining configs after this")


def fmt_bytes(n):
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def int_list(text):
    return [int(x) for x in str(text).split(",") if x.strip()]


def device_name():
    return torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"


def synchronize(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn, repeats=3, warmup=1, device="cpu"):
    """Median milliseconds of fn(). On CUDA triton.testing.do_bench (warm-up, many runs, synced);
    elsewhere `warmup` untimed calls then the median of `repeats` timed ones."""
    if str(device).startswith("cuda"):
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def train_step(model, idx, optimizer=None, device="cpu"):
    """A function running one training step on idx (B, T+1): forward, backward, then the
    optimizer's step (or, without one, just clearing the gradients)."""
    def step():
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        synchronize(device)
    return step


@torch.no_grad()
def prefilled_step(model, context, steps, device="cpu", prefill_chunk=None, forward=None):
    """(step, {prefill_s, cache_bytes}): `context` random tokens prefilled into fresh caches sized for
    `steps` more (in chunks of prefill_chunk tokens, or one pass); step() then decodes one greedy
    token through `forward` (default: model itself; e.g. model.compiled_step)."""
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(context)).to(device)
    caches = model.init_caches(1, context + steps)
    chunk = prefill_chunk or context
    t0 = time.perf_counter()
    for start in range(0, context, chunk):
        logits, _ = model(prompt[:, start:start + chunk], caches=caches, last_only=True)
    synchronize(device)
    prefill_s = time.perf_counter() - t0
    state, forward = {"logits": logits}, forward or model

    @torch.no_grad()
    def step():
        token = state["logits"][:, -1].argmax(-1, keepdim=True)
        state["logits"], _ = forward(token, caches=caches, last_only=True)
        synchronize(device)
    return step, {"prefill_s": prefill_s, "cache_bytes": sum(c.nbytes() for c in caches)}


def decode_cost(model, context, steps, device="cpu", prefill_chunk=None):
    """{ms_per_token, prefill_s, cache_bytes}: prefilled_step, then the median of `steps` greedy one-token steps."""
    step, info = prefilled_step(model, context, steps, device, prefill_chunk)
    return {"ms_per_token": median_ms(step, repeats=steps, warmup=0), **info}


class Budget:
    """A loop under a time limit: `if budget.allows(label)` is False (and label recorded as
    skipped) once `seconds` have passed, so a benchmark always finishes with a table."""

    def __init__(self, seconds):
        self.seconds, self.t0, self.skipped = seconds, time.time(), []

    def allows(self, label):
        if time.time() - self.t0 > self.seconds:
            self.skipped.append(label)
            return False
        return True

    def elapsed(self):
        return time.time() - self.t0


def attempt(fn):
    """fn()'s dict, or {"error": ...} with the traceback on stderr: one failing case must not end a run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (report and go on)
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}


class PeakMemory(TorchDispatchMode):
    """Bytes of op outputs alive at once on CPU: +nbytes when an op returns a new storage,
    -nbytes when that storage is freed (views share a storage and count once). The CPU
    counterpart of torch.cuda.max_memory_allocated, except scratch a kernel frees inside itself."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = self.largest = 0
        self.tracked = set()

    def _freed(self, ptr, nbytes):
        self.live -= nbytes
        self.tracked.discard(ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in self.tracked:
                continue
            self.tracked.add(ptr)
            self.live += nbytes
            self.peak, self.largest = max(self.peak, self.live), max(self.largest, nbytes)
            weakref.finalize(storage, self._freed, ptr, nbytes)
        return out


def peak_bytes(fn, device):
    """(peak, largest tensor) bytes allocated during one fn() beyond what existed before
    (largest is NaN on CUDA, where the allocator does not say)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, float("nan")
    with PeakMemory() as meter:
        fn()
    return meter.peak, meter.largest


def emit(markdown, results, args):
    """Markdown to stdout (and --out), results to --json."""
    print(markdown)
    if getattr(args, "out", None):
        with open(args.out, "w") as f:
            f.write(markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)


def read_run(run_dir):
    """One train.py run folder: its summary.json plus ms per training iteration (from the
    train config in its ckpt.pt, read without the weights), as a dict."""
    from trainer.rundir import Run
    run = Run(run_dir)
    cfg = run.header("last").get("config") or {}
    tokens_per_iter = cfg.get("batch_size", 0) * cfg.get("block_size", 0) * cfg.get("gradient_accumulation_steps", 0)
    tps = run.summary.get("tokens_per_sec")
    return {"run": run.name, **run.summary,
            "ms_per_iter": 1e3 * tokens_per_iter / tps if tps and tokens_per_iter else float("nan")}


def runs_table(run_dirs):
    """(markdown, rows) of train.py run folders: final/best val loss, ms/iter, cache, wall time."""
    rows = [read_run(d) for d in run_dirs]
    lines = [("| run | attention | pos | params | iters | final val loss | best val loss | ms/iter | tok/s "
             "| KV cache B/token | wall s |"),
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['attention']} | {r['pos_encoding']} | {r['params']:,} | {r['iters']} | "
                     f"{r['final_val_loss']:.4f} | {r['best_val_loss']:.4f} | {r['ms_per_iter']:.1f} | "
                     f"{r['tokens_per_sec']:,.0f} | {r['kv_cache_bytes_per_token']:,.0f} | {r['wall_s']:.0f} |")
    return "\n".join(lines), rows


def load_average():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
