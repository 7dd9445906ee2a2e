"""Cost tables: docs/cost.md's plans and docs/sparse.md's costs against context (tools.plan on the meta
device: nothing stored, the code is the source), the long-context benchmark
(docs/results/longctx: the timings, with parameters and cache bytes from the code) and the CPU-thread
measurements (docs/results/threads).
"""
import functools
import os
from types import SimpleNamespace

import torch

from model import GPT
from tools import plan
from tools.benchmarks import longctx
from tools.tables.source import CACHE_UNIT, HERE, cache_bytes, md_table, state_bytes, study


def plan_rows(configs, overrides, **flags):
    """tools.plan's rows for config files (relative to the repo) with overrides and its own flags."""
    return _plan_rows(tuple(configs), tuple(overrides), tuple(sorted(flags.items())))


@functools.cache
def _plan_rows(configs, overrides, flags):   # the code does not change within a process: build once
    opts = plan.parse_options({**plan.DEFAULTS, **{k: str(v) for k, v in flags}})
    rows = []
    for path in configs:
        full = os.path.join(HERE, path)
        rows.append(plan.plan_row(full, plan.build_planned_model(full, list(overrides), opts), opts))
    return rows, opts


COST_CONFIGS = [f"config/{v}.py" for v in ("mha", "gqa", "mqa", "mla", "bigbird", "gla", "gla_nodecay", "learned",
                                             "alibi", "fox")]
BIGBIRD_ITC = ["--sparse_block=64", "--sparse_window=3", "--sparse_global=2", "--sparse_random=3"]
NSA_PAPER = ["--sparse_block=64", "--nsa_topk=16", "--sliding_window=512"]   # the paper's blocks of 64, 16 read, window
SHAPES = {"124m": ["--n_layer=12", "--n_head=12", "--n_embd=768"],
          "7b": ["--n_layer=32", "--n_head=32", "--n_embd=4096"]}


def cost_plan(shape, context, extra=()):
    """docs/cost.md: every variant at a shape and context, then nsa at the paper's blocks; extra: (label, config,
    overrides) rows added below."""
    def table(root):
        flags = [*SHAPES[shape], f"--block_size={context}"]
        rows, opts = plan_rows(COST_CONFIGS, flags + BIGBIRD_ITC, context=context)
        rows = rows + [{**plan_rows([config], flags + overrides, context=context)[0][0], "variant": label}
                       for label, config, overrides in (("nsa", "config/nsa.py", NSA_PAPER), *extra)]
        return plan.table_lines(rows, opts)
    return table


def sparse_plan(root):
    """docs/sparse.md: each sparse variant at the study's width, at 512 and 32k tokens (bf16 cache)."""
    configs = [f"config/study512/{v}.py" for v in ("mha", "swa", "moba", "bigbird")]
    short, _ = plan_rows(configs, ["--block_size=32768"], context=512, vocab_size=65)
    long, _ = plan_rows(configs, ["--block_size=32768"], context=32768, vocab_size=65)

    def flops(r):
        return f"{r['train_flops_per_token'] / 1e9:.3g} ({r['attn_flops_per_token'] / r['train_flops_per_token']:.0%})"
    return md_table(["variant", "train GFLOP/token at 512 (attention's share)", "at 32k",
                     f"cache/seq at 512 ({CACHE_UNIT})", "at 32k", "keys/query at 32k"],
                    [[s["variant"], flops(s), flops(n), plan.fmt_bytes(s["kv_cache_bytes_per_seq"]),
                      plan.fmt_bytes(n["kv_cache_bytes_per_seq"]), f"{n['keys_per_query']:,}"]
                     for s, n in zip(short, long)])


def longctx_rows(rows):
    """The stored timings as tools/benchmarks/longctx.py rows, with the model's own numbers from the code
    at the suite's width: parameters, and the cache it holds after the last context (bf16; a state fp32)."""
    args = SimpleNamespace(overrides=[], quick=False, vocab_size=65)
    out = []
    for r in rows:
        contexts = [d["context"] for d in r["decode"]]
        with torch.device("meta"):
            m = GPT(longctx.model_config(os.path.join(HERE, r["config"]), args, contexts[-1]))
        last = cache_bytes(m, contexts[-1]) * contexts[-1] + state_bytes(m)
        out.append({"variant": r["variant"], "attention": m.config.attention, "pos_encoding": m.config.pos_encoding,
                    "params": m.num_params(), "kv_cache_bytes_per_token": cache_bytes(m),
                    "cache_state_bytes": state_bytes(m),
                    "train": [{**t, "peak_mem_bytes": t["peak_mem_mib"] * 2 ** 20} for t in r["train"]],
                    "decode": [*r["decode"][:-1], {**r["decode"][-1], "cache_bytes": last}]})
    return out


def longctx_table(part):
    def table(root):
        rows = longctx_rows(study(root, "longctx")[part]["rows"])
        return longctx.table_lines(rows, [t["T"] for t in rows[0]["train"]], [d["context"] for d in rows[0]["decode"]],
                                   f"{CACHE_UNIT}; a constant state fp32")
    return table


def threads(root):
    rows = study(root, "threads")["rows"]
    best = min(r["busy_ms_per_iter"] for r in rows)
    return md_table(["setting", "quiet ms/iter", "threads", "busy ms/iter", "threads", "busy / quiet",
                     "busy / best busy"],
                    [[r["setting"], f"{r['quiet_ms_per_iter']:.1f}", r["quiet_threads"], f"{r['busy_ms_per_iter']:.1f}",
                      r["busy_threads"], f"{r['busy_ms_per_iter'] / r['quiet_ms_per_iter']:.2f}",
                      f"{r['busy_ms_per_iter'] / best:.2f}"] for r in rows])


TABLES = {
    "cost-124m-4k": cost_plan("124m", 4096),
    "cost-124m-32k": cost_plan("124m", 32768),
    "cost-7b-4k": cost_plan("7b", 4096),
    "cost-7b-32k": cost_plan("7b", 32768, [("gqa, --n_kv_head=8", "config/gqa.py", ["--n_kv_head=8"])]),
    "sparse512-plan": sparse_plan,
    "longctx-all": longctx_table("all"),
    "longctx-mla": longctx_table("mla"),
    "threads": threads,
}
