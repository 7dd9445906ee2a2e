"""Where one attention layer's training step goes, ATen op by ATen op: the first block's attention,
forward and backward, at the config's shape (its batch, context and width), each ATen call timed
by a TorchDispatchMode. On the 2-core CPU these studies run on, torch.profiler's own overhead per
call inflated the small ops that the linear family and the delta rule are made of; this timer adds
a few µs per call alike to every op. Per config: the ATen ops per step, the time inside them, and
the costliest ops by name and input shapes.

    python -m tools.bench --suite=ops config/study256/mha.py config/ladder256/deltanet.py
    python -m tools.bench --suite=ops config/ladder256/gated_deltanet.py --threads=2 --top=20 --json ops.json
    python -m tools.bench --suite=ops config/base_shakespeare_char.py --dtype=bfloat16   # the forward under autocast

Read the times against each other (one config's ops, or two configs in one run), not against the
cpu suite's step times: the timer's own cost is inside them. The layer is built as the cpu suite
builds it (each config's MLP width solved to the first config's parameters; the attention layer
does not depend on it), eager, in fp32 or with the forward under bf16 autocast (--dtype).
"""
import collections
import contextlib
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tools.benchmarks.cpu import build, name, suite_keys
from tools.benchmarks.harness import emit, parser
from trainer.allocator import keep_freed_memory
from trainer.cli import fail


class OpTimer(TorchDispatchMode):
    """Seconds and calls per (op, input shapes) of every ATen call made under it."""

    def __init__(self):
        super().__init__()
        self.seconds, self.calls = collections.defaultdict(float), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        key = (func.overloadpacket.__name__, tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))[:2])
        self.seconds[key] += time.perf_counter() - start
        self.calls[key] += 1
        return out


def layer_ops(keys, steps, top, dtype="float32"):
    """{ops_per_step, ms_in_ops, top: [{op, shapes, calls, ms}]} per step of the first block's attention."""
    attn = build(keys).h[0].attn
    x = torch.randn(keys["batch_size"], keys["block_size"], keys["n_embd"], requires_grad=True)
    pos = torch.arange(keys["block_size"])
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()

    def step():
        with autocast:
            out = attn(x, pos)
        out.float().sum().backward()
    for _ in range(3):
        step()   # warm up: lazy setup, the allocator's pools
    timer = OpTimer()
    with timer:
        for _ in range(steps):
            step()
    costliest = sorted(timer.seconds.items(), key=lambda kv: -kv[1])[:top]
    return {"ops_per_step": sum(timer.calls.values()) / steps, "ms_in_ops": sum(timer.seconds.values()) * 1e3 / steps,
            "top": [{"op": op, "shapes": [list(s) for s in shapes], "calls": timer.calls[(op, shapes)] / steps,
                     "ms": sec * 1e3 / steps} for (op, shapes), sec in costliest]}


def markdown(results):
    lines = ["| config | ATen ops per step | ms in ops per step |", "|---|---:|---:|"]
    lines += [f"| {c} | {r['ops_per_step']:,.0f} | {r['ms_in_ops']:.2f} |" for c, r in results["layers"].items()]
    for c, r in results["layers"].items():
        lines += ["", f"{c}: the costliest ops", "", "| op | input shapes | calls per step | ms per step |",
                  "|---|---|---:|---:|"]
        lines += [f"| {t['op']} | {' x '.join(str(tuple(s)) for s in t['shapes'])} | {t['calls']:g} | {t['ms']:.3f} |"
                  for t in r["top"]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("configs", nargs="+", help="config files; the first sets the parameters the others match")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per config")
    ap.add_argument("--top", type=int, default=10, help="ops listed per config")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="bfloat16: under autocast")
    args = ap.parse_args(argv)
    if min(args.threads, args.steps, args.top) < 1:
        fail("--threads, --steps and --top must be at least 1")
    keys, _ = suite_keys(args.configs, args.quick)
    allocator = keep_freed_memory()
    torch.set_num_threads(args.threads)
    steps = 2 if args.quick else args.steps
    results = {"torch": torch.__version__, "threads": args.threads, "steps": args.steps, "allocator": allocator,
               "dtype": args.dtype,
               "layers": {name(p): layer_ops(k, steps, args.top, args.dtype) for p, k in keys.items()}}
    emit(f"one attention layer's forward + backward, {args.dtype}, {args.threads} thread(s), {results['steps']} steps; "
         f"torch {torch.__version__}\n\n" + markdown(results), results, args)


if __name__ == "__main__":
    main()
