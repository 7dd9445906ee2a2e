"""Look inside a trained model: what its attention does with positions, measured.

    python -m tools.analyze out-mha [--out DIR] [--windows 32] [--length N] [--layers 0 3]
                                    [--prompt TEXT] [--ckpt best|last]

On N windows of the run's validation text (the dataset named in the checkpoint's config),
it measures the properties a positional encoding should give:
  decay            mean attention weight against query-key distance, per layer (over windows,
                   heads and queries; only over the pairs a layer can see, so BigBird's
                   block layout is respected), beside the uniform baseline: every query
                   spreading its weight evenly over the keys it can see.
  shift_invariance the first half of each window run at positions 0.. and again at positions
                   k.. (k = length - half: the latest offset inside the window), nothing else
                   changed: the max abs change of any attention weight of any layer. Zero up to
                   numerics when scores depend only on relative positions (rope, alibi, none).
                   (The shifted copy starts from an empty cache whose position is k; padding it
                   with other text instead would change what a causal model sees before it.)
  same_token_ratio attention to earlier occurrences of the query's own token over attention to
                   other tokens at the same distances: the per-distance means weighted by how
                   many same-token pairs each distance has (> 1: semantic aggregation).
and draws decay.png (with RoPE's relative upper bound, RoFormer section 3.4.3, for the
model's head dim and base, and ALiBi's factors exp(-m_h d) for its head count) and maps.png
(weights of chosen layers and heads on a prompt). Writes OUT/analysis.{json,md}.

How the weights are read. Softmax variants: every layer's `attend` call is recorded by
attention.record.record_attention, which computes the probabilities with plain softmax math
(the model is loaded with attn_impl=naive, mla_decode=expanded so every layer goes through
`attend` with its full mask). Gated linear attention has no probabilities; its output before
the norm is o_i = sum_{j<=i} w_ij v_j with
    w_ij = scale * sum_d q_id k_jd exp(b_id - b_jd),   b_i = g_1 + ... + g_i (log-decays),
since S_i = sum_{j<=i} diag(exp(b_i - b_j)) k_j^T v_j. The effective weight of token j is
|w_ij| / sum_j' |w_ij'|: its share of that sum (the per-head RMSNorm rescales a row as a
whole, so it leaves the shares alone). q, k, g come from attention.record.record_linear.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch

from attention import variant_class
from attention.positional import RoPE, alibi_slopes, rope_inv_freq
from attention.record import record_attention
from tokenizer import TokenizerError, load_tokenizer
from trainer.checkpoint import CheckpointError
from trainer.cli import OneLineParser, check_output, fail
from trainer.rundir import Run
from trainer.settings import resolve_device

NEAR = 4  # distances 1..NEAR count as "near" in the decay summary


def parse_args(argv=None):
    ap = OneLineParser(prog="python -m tools.analyze", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a train.py out_dir (best.pt / ckpt.pt)")
    ap.add_argument("--out", default=None, help="output folder (default RUN_DIR/analysis)")
    ap.add_argument("--windows", type=int, default=32, help="validation windows to average over")
    ap.add_argument("--length", type=int, default=0, help="tokens per window; 0 = block_size")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="layers drawn in maps.png (default all, "
                    "at most 4: first and last)")
    ap.add_argument("--prompt", default=None, help="text for maps.png (default: the first validation window)")
    ap.add_argument("--ckpt", default="best", choices=("best", "last"), help="best.pt (when present) or ckpt.pt")
    ap.add_argument("--data_dir", default=None, help="override the checkpoint's data_dir")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.windows < 1 or args.length < 0 or args.length == 1:
        ap.error("--windows must be at least 1 and --length 0 (block_size) or at least 2")
    check_output(args.out, "--out", folder=True)
    return args


# ---- reading the model, its data and its attention ----
def load_inputs(args):
    """(model, tokenizer, val tokens as a LongTensor, window length); every problem is one line."""
    if not os.path.isdir(args.run_dir):
        fail(f"{args.run_dir} is not a folder; pass a train.py out_dir (python -m tools.analyze out-gqa)")
    try:
        model, ckpt = Run(args.run_dir).load_model(resolve_device(args.device), args.ckpt, attn_impl="naive",
                                                   mla_decode="expanded")
        if "meta" not in ckpt or "config" not in ckpt:
            raise CheckpointError(f"{args.run_dir}: the checkpoint lacks meta or config; "
                                  "it was not written by train.py")
        tokenizer = load_tokenizer(ckpt["meta"])
    except (TokenizerError, ValueError) as e:  # CheckpointError is a ValueError
        fail(str(e))
    cfg, n_layer, block = model.config, model.config.n_layer, model.config.block_size
    length = args.length or block
    bounded = cfg.pos_encoding == "learned" or getattr(model.h[0].attn, "context_within_block_size", False)
    if bounded and length > block:
        fail(f"--length={length} is longer than block_size={block}, where {cfg.pos_encoding} positions / "
             f"attention={cfg.attention} stop; use at most {block}")
    if args.layers is not None and any(not 0 <= i < n_layer for i in args.layers):
        fail(f"--layers {' '.join(map(str, args.layers))}: the model has {n_layer} layers, 0 to {n_layer - 1}")
    data_dir = os.path.join(args.data_dir or ckpt["config"].get("data_dir", "data"), ckpt["config"].get("dataset", ""))
    val_path = os.path.join(data_dir, "val.bin")
    if not os.path.isfile(val_path):
        fail(f"{val_path} not found (the run's dataset); prepare it or pass --data_dir")
    val = np.memmap(val_path, dtype=np.dtype(ckpt["meta"].get("dtype", "uint16")), mode="r")
    if len(val) < length + 1:
        fail(f"{val_path} holds {len(val)} tokens, fewer than one window of {length}; lower --length")
    return model, tokenizer, val, length


def forward_at(model, idx, start, force_uniform=False):
    """Run idx (B, T) as if it stood at positions start..start+T-1, from an empty cache (so
    nothing comes before it), recording every layer. Returns per layer (weights (B, H, T, T),
    visible (H or 1, T, T) bool, or (B, H, T, T) where each sequence has its own (MoBA's chosen blocks));
    weights are probabilities, or GLA's effective weights.
    force_uniform: attention.record.record_attention's test hook (softmax layers only)."""
    caches = model.init_caches(idx.size(0), idx.size(1))
    for cache in caches:
        cache.pos = start  # positions continue from the cache's (see GPT.forward)
    with torch.no_grad(), record_attention(force_uniform) as records:
        model(idx, caches=caches)
    return [layer_weights(r) for r in records]


def layer_weights(record):
    if "probs" in record:
        allowed = record["allowed"]
        return record["probs"], allowed if allowed.dim() >= 3 else allowed[None]
    return linear_attention_weights(record["q"], record["k"], record["g"], record["scale"])


def linear_attention_weights(q, k, g, scale, max_elems=2 ** 24):
    """GLA's effective weights (module docstring): q (B, H, T, D), k and g (B, Hkv, T, D) ->
    (|w| normalized per query (B, H, T, T), causal mask (1, T, T)). The pairwise decays
    (B, H, queries, T, D) are formed for a slice of queries at a time, under max_elems."""
    B, H, T, D = q.shape
    G = H // k.size(1)
    k = k.repeat_interleave(G, dim=1)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if g is None:
        w = (q @ k.transpose(-1, -2)) * scale
    else:
        b = g.repeat_interleave(G, dim=1).cumsum(dim=2)                       # (B, H, T, D)
        step = max(1, max_elems // (B * H * T * D))
        rows = []
        for i in range(0, T, step):
            exponent = (b[:, :, i:i + step, None, :] - b[:, :, None, :, :]).masked_fill(
                ~causal[i:i + step, :, None], float("-inf"))                 # <= 0 where j <= i
            rows.append(torch.einsum("bhid,bhjd,bhijd->bhij", q[:, :, i:i + step], k, exponent.exp()))
        w = torch.cat(rows, dim=2) * scale
    w = w.abs().masked_fill(~causal, 0.0)
    return w / w.sum(dim=-1, keepdim=True).clamp_min(1e-30), causal[None]


# ---- the measurements ----
class DistanceStats:
    """Sums of weights and pair counts per query-key distance, for one layer, over batches."""

    def __init__(self, max_distance):
        self.weight, self.uniform, self.count = (torch.zeros(max_distance + 1, dtype=torch.float64) for _ in range(3))
        self.same, self.other = torch.zeros(2, max_distance + 1, dtype=torch.float64), \
            torch.zeros(2, max_distance + 1, dtype=torch.float64)   # rows: weight sum, pair count

    def add(self, weights, visible, tokens):
        B, H, T, _ = weights.shape
        if visible.dim() == 4:  # a mask per sequence: one sequence at a time
            for b in range(B):
                self.add(weights[b:b + 1], visible[b], tokens[b:b + 1])
            return
        visible = visible.expand(H, T, T)
        dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).expand(H, T, T)
        d, w = dist[visible], weights.double().permute(1, 2, 3, 0)[visible]   # (pairs,), (pairs, B)
        uniform = (visible / visible.sum(dim=-1, keepdim=True).clamp_min(1)).double()[visible]
        self.weight.index_add_(0, d, w.sum(1))
        self.uniform.index_add_(0, d, uniform * B)
        self.count.index_add_(0, d, torch.full_like(uniform, B))
        same = (tokens[:, :, None] == tokens[:, None, :]).permute(1, 2, 0).expand(H, T, T, B)[visible]  # (pairs, B)
        for stats, chosen in ((self.same, same), (self.other, ~same)):
            stats[0].index_add_(0, d, (w * chosen).sum(1))
            stats[1].index_add_(0, d, chosen.sum(1).double())

    def curves(self):
        seen = self.count > 0
        d = torch.nonzero(seen).flatten()
        return ({"distance": d.tolist(), "weight": (self.weight[seen] / self.count[seen]).tolist()},
                {"distance": d.tolist(), "weight": (self.uniform[seen] / self.count[seen]).tolist()})

    def same_token_terms(self):
        """(sum_d n_same(d) mean_same(d), sum_d n_same(d) mean_other(d)) over d > 0 where both occur."""
        both = (self.same[1] > 0) & (self.other[1] > 0)
        both[0] = False
        num = self.same[0][both].sum()
        den = (self.same[1][both] * self.other[0][both] / self.other[1][both]).sum()
        return float(num), float(den)


def window_batch(model, length):
    """Windows per forward: up to 8, fewer when the (B, H, T, T) weights of a layer get large."""
    return max(1, min(8, 2 ** 22 // (model.config.n_head * length * length)))


def measure(model, val, length, n_windows, force_uniform=False):
    """Per-layer DistanceStats over n_windows evenly spaced validation windows, and the starts."""
    batch = window_batch(model, length)
    starts = np.linspace(0, len(val) - length - 1, n_windows).astype(np.int64)
    stats = [DistanceStats(length - 1) for _ in range(model.config.n_layer)]
    for i in range(0, n_windows, batch):
        idx = torch.stack([torch.from_numpy(val[s:s + length].astype(np.int64)) for s in starts[i:i + batch]])
        for layer, (w, visible) in zip(stats, forward_at(model, idx, 0, force_uniform)):
            layer.add(w, visible, idx)
        print(f"analyze: windows {min(i + batch, n_windows)}/{n_windows}", file=sys.stderr)
    return stats, starts


def shift_invariance(model, val, starts, length):
    """Max abs change of any weight when the first half of each window moves from position 0
    to position length - half (module docstring). Returns (overall, per layer)."""
    half, batch = length // 2, window_batch(model, length)
    per_layer = torch.zeros(model.config.n_layer, dtype=torch.float64)
    for i in range(0, len(starts), batch):
        idx = torch.stack([torch.from_numpy(val[s:s + half].astype(np.int64)) for s in starts[i:i + batch]])
        at_zero, shifted = forward_at(model, idx, 0), forward_at(model, idx, length - half)
        for layer, ((w0, _), (w1, _)) in enumerate(zip(at_zero, shifted)):
            per_layer[layer] = max(per_layer[layer], (w0.double() - w1.double()).abs().max())
    return float(per_layer.max()), per_layer.tolist()


def rope_relative_bound(inv_freq, max_distance):
    """RoFormer section 3.4.3: |sum_j h_j e^{i r theta_j}| <= max|h_{j+1} - h_j| * sum_j |S_j|
    with S_j = sum_{k<j} e^{i r theta_k}; the curve is (1 / (d/2)) sum_{j=1}^{d/2} |S_j| at
    relative distance r, normalised to 1 at r = 0. inv_freq: the theta_j (RoPE.inv_freq)."""
    r = torch.arange(max_distance + 1, dtype=torch.float64)
    angles = r[:, None] * inv_freq[None, :]
    partial = torch.polar(torch.ones_like(angles), angles).cumsum(dim=1).abs()   # |S_1| .. |S_{d/2}|
    bound = partial.mean(dim=1)
    return (bound / bound[0]).tolist()


def rope_base_lower_bound(head_dim, context, per_decade=100, max_base=1e12):
    """Men et al. 2024 ("Base of RoPE Bounds Context Length"): a model can still attend more to a
    similar key far away only while B(m) = sum_i cos(m theta_i) >= 0 for every distance m up to
    the context. The smallest base on a log grid (per_decade points per factor 10) for which it
    holds at all m in [0, context]; None if none up to max_base."""
    m = torch.arange(context + 1, dtype=torch.float64)[None, :, None]
    bases = np.logspace(0.1, math.log10(max_base), int((math.log10(max_base) - 0.1) * per_decade) + 1)
    per_op = max(1, 2 ** 22 // ((context + 1) * max(1, head_dim // 2)))   # ~32 MB of fp64 per tensor op
    for chunk in np.array_split(bases, math.ceil(len(bases) / per_op)):   # in order: the first that holds
        inv_freq = torch.stack([rope_inv_freq(head_dim, float(b)) for b in chunk])[:, None, :]
        holds = (torch.cos(m * inv_freq).sum(dim=2) >= 0).all(dim=1)
        if holds.any():
            return float(chunk[int(holds.nonzero()[0])])
    return None


def near_far(curve, length):
    """Mean weight at distances 1..NEAR over mean weight at distances >= length/2."""
    d, w = np.array(curve["distance"]), np.array(curve["weight"])
    near, far = w[(d >= 1) & (d <= NEAR)], w[d >= length // 2]
    return float(near.mean() / far.mean()) if len(near) and len(far) and far.mean() > 0 else None


def near_far_why(attn, length):
    """Why a layer has no near/far ratio: nothing is attended at distances >= length/2."""
    window = attn.cache_max_tokens()  # swa: the keys a query sees, itself included (distances 0..window-1)
    if window is not None and window <= length // 2:
        return (f"a sliding window of {window} tokens sees no key at distance >= {length // 2}: the far mean "
                "is 0, no ratio")
    return f"no attention weight at distances >= {length // 2}: the far mean is 0, no ratio"


# ---- plots and reports ----
def plot_decay(path, decay, uniform, config, length):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, theory) = plt.subplots(1, 2, figsize=(10, 3.8))
    for layer, curve in enumerate(decay):
        ax.plot(curve["distance"], curve["weight"], label=f"layer {layer}")
    ax.plot(uniform[0]["distance"], uniform[0]["weight"], "k--", label="uniform (layer 0)")
    ax.set(yscale="log", xlabel="query-key distance", ylabel="mean attention weight",
           title=f"measured: {config.attention}, {config.pos_encoding}")
    ax.legend(fontsize=7)
    r = list(range(length))
    rope = RoPE.from_config(config)  # what this model's RoPE turns (or would), scaling and fraction included
    first = config.layer_config(0)  # a plan: its first layer's variant
    head_dim = variant_class(first.attention).rope_dim(first) or config.n_embd // config.n_head
    rope_dim = rope.rotated_dims(head_dim)
    if rope_dim:
        theory.plot(r, rope_relative_bound(rope.inv_freq(head_dim), length - 1), "k",
                    label=f"RoPE relative upper bound (d={rope_dim}, base {config.rope_base:g}, "
                          f"scaling {config.rope_scaling})")
    for h, m in enumerate(alibi_slopes(config.n_head).tolist()):
        theory.plot(r, np.exp(-m * np.array(r)), alpha=0.6, label=f"ALiBi exp(-m d), m={m:.3g}" if h < 4 else None)
    theory.set(yscale="log", ylim=(1e-3, 1.5), xlabel="relative distance",
               title="theory for this shape (normalised at 0)")
    theory.legend(fontsize=7)
    for a in (ax, theory):
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_maps(path, model, prompt_ids, layers, tokenizer):
    """Weights of the chosen layers (rows) and up to 4 heads (columns) on the prompt; keys a
    layer cannot see are blank, so BigBird's blocks show."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm
    weights = forward_at(model, torch.tensor(prompt_ids)[None], 0)
    heads = list(range(min(4, model.config.n_head)))
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(2.4 * len(heads), 2.4 * len(layers)), squeeze=False)
    for row, layer in enumerate(layers):
        w, visible = weights[layer]
        visible = visible[0] if visible.dim() == 4 else visible   # the one sequence's mask
        for col, h in enumerate(heads):
            # a layer without heads (conv) records one map, drawn in every column
            image = w[0, min(h, w.size(1) - 1)].masked_fill(~visible[min(h, visible.size(0) - 1)], float("nan")).numpy()
            axes[row][col].imshow(image, cmap="viridis", norm=PowerNorm(0.5, vmin=0, vmax=1))
            axes[row][col].set_title(f"layer {layer} head {h}", fontsize=8)
            axes[row][col].set_xticks([])
            axes[row][col].set_yticks([])
    fig.suptitle(f"{model.config.attention}, {model.config.pos_encoding}: {tokenizer.decode(prompt_ids[:40])!r}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def ratio(num, den):
    return num / den if den > 0 else None


def fmt(value):
    return "-" if value is None else f"{value:.3g}"


def write_markdown(path, result):
    lines = [f"# Attention analysis: {result['attention']}, {result['pos_encoding']}", "",
             f"{result['windows']} validation windows of {result['length']} tokens from {result['checkpoint']}.", "",
             (f"- shift invariance (max abs change of a weight, text moved by {result['shift']}): "
              f"{result['shift_invariance']:.3g}"),
             (f"- same-token ratio (> 1: similar tokens get more attention at the same distance): "
              f"{fmt(result['same_token_ratio'])}"), "",
             "| layer | near/far measured | near/far uniform | same-token ratio | shift change |",
             "|---|---|---|---|---|"]
    whys = result.get("near_far_why") or [None] * len(result["near_far"])
    reasons = list(dict.fromkeys(w for w in whys if w))

    def near_far_cell(value, why):  # "-" alone said nothing: the footnote says why
        return fmt(value) if value is not None or not why else f"- ({reasons.index(why) + 1})"
    for i, (m, u, s, c, why) in enumerate(zip(result["near_far"], result["near_far_uniform"],
                                              result["same_token_ratio_per_layer"],
                                              result["shift_invariance_per_layer"], whys)):
        lines.append(f"| {i} | {near_far_cell(m, why)} | {near_far_cell(u, why)} | {fmt(s)} | {fmt(c)} |")
    lines += ["", (f"near/far: mean weight at distances 1-{NEAR} over mean weight at distances >= "
                   f"{result['length'] // 2}; long-distance decay means measured > uniform."),
              *[f"({i}) {why}" for i, why in enumerate(reasons, 1)], "",
              "![decay](decay.png)", "", "![maps](maps.png)", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def analyze(model, val, length, n_windows):
    """All measurements as the analysis.json dict (without file names)."""
    stats, starts = measure(model, val, length, n_windows)
    curves = [s.curves() for s in stats]
    terms = [s.same_token_terms() for s in stats]
    shift, shift_per_layer = shift_invariance(model, val, starts, length)
    total = ratio(sum(n for n, _ in terms), sum(d for _, d in terms))
    return {"attention": model.config.attention, "pos_encoding": model.config.pos_encoding,
            "decay": [c[0] for c in curves], "uniform": [c[1] for c in curves],
            "shift_invariance": shift, "shift_invariance_per_layer": shift_per_layer, "shift": length - length // 2,
            "same_token_ratio": total,
            "same_token_ratio_per_layer": [ratio(n, d) for n, d in terms],
            "near_far": [near_far(c[0], length) for c in curves],
            "near_far_uniform": [near_far(c[1], length) for c in curves],
            "near_far_why": [None if near_far(c[0], length) is not None and near_far(c[1], length) is not None
                             else near_far_why(block.attn, length) for c, block in zip(curves, model.h)],
            "windows": n_windows, "length": length}


@torch.no_grad()  # analysis only; restored on return, so callers in the same process keep autograd
def main(argv=None):
    t0 = time.time()
    args = parse_args(argv)
    model, tokenizer, val, length = load_inputs(args)
    prompt_ids = [int(t) for t in val[:length]]
    if args.prompt is not None:
        try:
            prompt_ids = tokenizer.encode(args.prompt)
        except TokenizerError as e:
            fail(f"--prompt: {e}")
        if not 1 <= len(prompt_ids) <= length:
            fail(f"--prompt is {len(prompt_ids)} tokens; give 1 to {length} (--length)")
    out = args.out or os.path.join(args.run_dir, "analysis")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out {out} ({e.strerror}); pick a writable folder")
    result = analyze(model, val, length, args.windows)
    result["checkpoint"] = Run(args.run_dir).checkpoint_path(args.ckpt)
    n_layer = model.config.n_layer
    layers = args.layers or (list(range(n_layer)) if n_layer <= 4 else [0, n_layer - 1])
    plot_decay(os.path.join(out, "decay.png"), result["decay"], result["uniform"], model.config, length)
    plot_maps(os.path.join(out, "maps.png"), model, prompt_ids, layers, tokenizer)
    result["wall_s"] = time.time() - t0
    with open(os.path.join(out, "analysis.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    write_markdown(os.path.join(out, "analysis.md"), result)
    print(f"analyze: shift invariance {result['shift_invariance']:.3g}, same-token ratio "
          f"{fmt(result['same_token_ratio'])}; wrote {out}/analysis.json, analysis.md, decay.png, maps.png "
          f"in {result['wall_s']:.1f}s", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
