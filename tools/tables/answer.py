"""docs/answer.md's one table: a row per variant, grouped by family, each column read from the study
that measured it (nothing here is measured anew):

    quality   the loss study that holds the variant, its paired test verdict against that study's MHA
              (fair256, sparse512, ladder256: table.json; ladder256_delta, fair256_fox_nsa: their stored runs;
              "-" for a study not stored yet)
    recall    Zoology's MQAR model (docs/results/zoology/): test accuracy at 4, 8 and 16 pairs, width 64,
              the mean over the seeds stored (the anchor's 4-head mha4 for mha, the families' for the rest)
    memory    tools.plan at GPT-2 124M's shape: decoding bytes per token of a sequence at 4k and 32k
              tokens (the K/V cache in bf16 plus a constant state in fp32, over the context)
    speed     tools.bench's cpu suite (docs/results/speed/cpu.json): MHA's ms per training step and per
              decoded token at 4k context over the variant's (above 1x: faster than MHA)
"""
import json
import os

from tools import compare
from tools.tables import stored, zoology
from tools.tables.cost import BIGBIRD_ITC, NSA_PAPER, SHAPES, plan_rows
from tools.tables.source import delta, md_table, results_dir, study

LONG = 32768
CONTEXTS = (4096, LONG)
WINDOW_124M = ["--sliding_window=4096"]   # Mistral 7B's window: the char-scale config's 32 means nothing at 124M
HYBRID = {"gla_mha": "gla,gla,gla,mha", "gdn_mha": "gated_deltanet,gated_deltanet,gated_deltanet,mha"}

# (family, variant, loss study, config file for tools.plan, cpu suite key, extra plan overrides)
ROWS = [
    ("softmax", "mha", "fair256", "config/mha.py", "study256/mha", []),
    ("softmax", "gqa", "fair256", "config/gqa.py", "study256/gqa", []),
    ("softmax", "mqa", "fair256", "config/mqa.py", "study256/mqa", []),
    ("softmax", "mla", "fair256", "config/mla.py", "study256/mla", []),
    ("softmax", "fox", "fair256_fox_nsa", "config/fox.py", "study256/fox", []),
    ("sparse", "swa", "sparse512", "config/swa.py", None, WINDOW_124M),
    ("sparse", "bigbird", "fair256", "config/bigbird.py", "study256/bigbird", BIGBIRD_ITC),
    ("sparse", "moba", "sparse512", "config/moba.py", None, []),
    ("sparse", "nsa", "fair256_fox_nsa", "config/nsa.py", "study256/nsa", NSA_PAPER),
    ("linear", "linear", "ladder256", "config/linear.py", "ladder256/linear", []),
    ("linear", "retnet", "ladder256", "config/retnet.py", "ladder256/retnet", []),
    ("linear", "gla", "fair256", "config/gla.py", "study256/gla", []),
    ("delta rule", "deltanet", "ladder256_delta", "config/deltanet.py", "ladder256/deltanet", []),
    ("delta rule", "gated_deltanet", "ladder256_delta", "config/gated_deltanet.py", "ladder256/gated_deltanet", []),
    ("hybrid", "gla_mha", "ladder256", "config/gla.py", None, [f"--attention={','.join([HYBRID['gla_mha']] * 3)}"]),
    ("hybrid", "gdn_mha", "ladder256_delta", "config/gated_deltanet.py", None,
     ["--pos_encoding=rope", f"--attention={','.join([HYBRID['gdn_mha']] * 3)}"]),
]
SCALE = {"fair256": "0.8M params, context 256", "sparse512": "context 512",
         "ladder256": "0.8M params, context 256", "ladder256_delta": "0.8M params, context 256",
         "fair256_fox_nsa": "0.8M params, context 256"}
STORED = {"ladder256_delta": stored.DELTA, "fair256_fox_nsa": ["mha", "fox", "nsa"]}   # run folders, not table.json
PAIRS = (4, 8, 16)


def paired_test(root, name):
    """{variant: {"mean", "ci95", "verdict"}} against the study's mha on test."""
    if name in STORED:
        if not os.path.isdir(results_dir(root, name)):
            return {}
        return compare.paired_rows(stored.groups_of(root, name, STORED[name]), compare.METRICS["test"], stored.MARGIN)
    st = study(root, name)
    fair = study(root, "fair256")["paired"]["test"] if name == "ladder256" else {}
    return {c: fair.get(c) if "mean" not in d else d for c, d in st["paired"]["test"].items()}


def quality(root, variant, name, verdicts):
    if variant == "mha":
        return "reference"
    d = verdicts[name].get(variant)
    return f"{d['verdict']}, {delta(d)}" if d else "-"


def recall(root, variant):
    """'0.99 / 0.99 / 1.00': mean test accuracy per pair count; '-' where the cell is not stored yet."""
    accs = [zoology.test_accuracy(root, variant, pairs) for pairs in PAIRS]
    return " / ".join("-" if a is None else f"{a:.2f}" for a in accs)


def fmt_bytes(b):
    return f"{b / 1024:,.1f} KiB" if b >= 1024 else f"{b:,.0f} B"


def memory(config, extra):
    """Decoding bytes per token at each context: (cache of the sequence + constant state) / context."""
    cells = []
    for context in CONTEXTS:
        rows, _ = plan_rows([config], [*SHAPES["124m"], f"--block_size={LONG}", *extra], context=context)
        r = rows[0]
        cells.append(fmt_bytes((r["kv_cache_bytes_per_seq"] + r["cache_state_bytes"]) / context))
    return " / ".join(cells)


def speed(cpu, key):
    """MHA's time over the variant's: a training step (fp32, 2 threads, eager) and a decoded token after 4k of
    context (batch 1, one thread, as the suite decodes)."""
    if key is None:
        return "-", "-"
    train = next(r for r in cpu["train_ms_per_step"]
                 if r["dtype"] == "float32" and r["compile"] == "off" and r["threads"] == 2)
    decode = {r["variant"]: next(d["ms_per_token"] for d in r["decode"] if d["context"] == 4096) for r in cpu["decode"]}
    name = key.split("/")[1]
    if key not in train or name not in decode:   # the suite's file predates the variant
        return "-", "-"
    return f"{train['study256/mha'] / train[key]:.2f}x", f"{decode['mha'] / decode[name]:.2f}x"


def answer(root):
    with open(os.path.join(results_dir(root, "speed"), "cpu.json")) as f:
        cpu = json.load(f)
    verdicts = {name: paired_test(root, name) for name in dict.fromkeys(r[2] for r in ROWS)}
    rows = []
    for family, variant, name, config, key, extra in ROWS:
        rows.append([family, f"`{variant}`", quality(root, variant, name, verdicts), f"{name} ({SCALE[name]})",
                     recall(root, variant), memory(config, extra), *speed(cpu, key)])
    return md_table(["family", "attention=", "test loss vs MHA: verdict, Δ [95% CI]", "study (scale)",
                     "MQAR test acc, 4 / 8 / 16 pairs", "decode bytes/token at 4k / 32k (124M)",
                     "CPU train step vs MHA", "CPU decode at 4k vs MHA"], rows)


TABLES = {"answer": answer}
