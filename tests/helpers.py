"""Constants and helpers shared by the tests (fixtures live in conftest.py)."""
import contextlib
import functools
import io
import math
import os
import runpy
import subprocess
import sys
import time
import traceback
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from model import GPT, GPTConfig  # noqa: E402  (after the root is on sys.path)

ATTENTIONS = {"mha": 0, "gqa": 2, "mqa": 0}   # attention -> n_kv_head (0 = implied)
POS_ENCODINGS = ("rope", "alibi", "learned", "sinusoidal", "none")


def tiny_model_kwargs(**overrides):
    kw = dict(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=False)
    kw.update(overrides)
    return kw


def perturbed_model(seed=0, **overrides):
    """A tiny GPT (tiny_model_kwargs + overrides) in eval mode, seeded, every weight moved by
    N(0, 0.05): larger weights than init, so that positions, heads and gates matter."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**tiny_model_kwargs(**overrides))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def accepts(**overrides):
    """Whether GPTConfig validates tiny_model_kwargs + overrides (a combination the model takes)."""
    try:
        GPTConfig(**tiny_model_kwargs(**overrides))
        return True
    except ValueError:
        return False


def naive_gap(model, idx):
    """Max abs difference of the logits with the model's attn_impl and with attn_impl=naive (the
    dense reference math); leaves the model on naive."""
    with torch.no_grad():
        fast, _ = model(idx)
        set_attn_impl(model, "naive")
        naive, _ = model(idx)
    return (fast - naive).abs().max().item()


def train_args(data_root, out_dir, *extra):
    """Overrides for a tiny CPU run on the prepared data."""
    return [os.path.join(ROOT, "config/base_shakespeare_char.py"), f"--data_dir={data_root}",
            f"--out_dir={out_dir}", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32",
            "--block_size=32", "--batch_size=8", "--eval_iters=5", "--log_interval=10",
            "--warmup_iters=5", "--learning_rate=1e-2", "--lr_decay_iters=100", *extra]


def reference_qkv_attention(attn, x, pos_encoding, mask=None, probs_out=None, rope=None):
    """Independent causal attention for the c_attn/c_proj layers (MHA family, BigBird): a
    loop over heads with per-head weights, explicit scores, RoPE by 2x2 rotations of the
    pairs (x[2i], x[2i+1]), ALiBi slopes of 4 heads spelled out, GQA by head groups, the
    sigmoid output gate (bias-free) when the layer has one.
    mask: optional bool (T, T) of allowed pairs (default: causal); probs_out: a list that
    receives each head's probabilities (B, T, T); rope: optional (inv_freq (r/2,), attention
    factor) from elsewhere (e.g. Hugging Face's scalings): the first r dims turn, times the factor."""
    B, T, C = x.shape
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    W = attn.c_attn.weight
    q_w, k_w, v_w = W[:H * D], W[H * D:(H + Hkv) * D], W[(H + Hkv) * D:]
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool).tril()
    outs = []
    for h in range(H):
        g = h // (H // Hkv)
        q, k, v = (x @ w[i * D:(i + 1) * D].T for w, i in ((q_w, h), (k_w, g), (v_w, g)))
        if pos_encoding == "rope":
            inv_freq, factor = rope or (10000.0 ** (-torch.arange(0, D, 2).double() / D), 1.0)
            r = 2 * len(inv_freq)
            ang = torch.arange(T)[:, None].double() * inv_freq.double()
            c, s = (ang.cos() * factor).float(), (ang.sin() * factor).float()

            def rot(t):
                e, o = t[..., 0:r:2], t[..., 1:r:2]
                return torch.cat([torch.stack((e * c - o * s, e * s + o * c), dim=-1).flatten(-2), t[..., r:]], -1)
            q, k = rot(q), rot(k)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)
        if pos_encoding == "alibi":
            assert H == 4, "the slopes below are those of 4 heads"
            i = torch.arange(T)
            scores = scores - 2.0 ** (-2.0 * (h + 1)) * (i[:, None] - i[None, :]).float()  # 1/4 ... 1/256
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        if probs_out is not None:
            probs_out.append(probs)
        outs.append(probs @ v)
    y = torch.cat(outs, dim=-1)
    if getattr(attn, "gate_proj", None) is not None:  # attn_output_gate=sigmoid: Qiu et al.'s G1 gate
        y = y * torch.sigmoid(x @ attn.gate_proj.weight.T)
    return y @ attn.c_proj.weight.T


def assert_sampling_same_with_and_without_cache(out_dir, capsys, max_new_tokens=26):
    """sample.py prints the same text with and without --no_cache, greedy and seeded.
    "ROMEO:" + 26 tokens = block_size 32 of train_args: inside the window, where the two
    must agree exactly (past it a sliding cache keeps K/V computed under an earlier window)."""
    import sample
    capsys.readouterr()
    for mode in (["--temperature=0"], ["--temperature=1.0", "--seed=7"]):
        common = [f"--out_dir={out_dir}", f"--max_new_tokens={max_new_tokens}", "--start=ROMEO:",
                  "--num_samples=2", *mode]
        sample.main(common)
        cached = capsys.readouterr().out
        sample.main(common + ["--no_cache"])
        assert cached == capsys.readouterr().out
        assert cached.startswith("ROMEO:") and cached.count("---------------") == 2
    assert len(set(cached[6:6 + max_new_tokens])) >= 3  # sampled text varies: the comparison has teeth


def decode_in_chunks(model, idx, splits=(7, 12)):
    """Logits of idx decoded with caches: a prefill up to splits[0], a multi-token call up to
    splits[1], then one token at a time. Returns (logits (B, T, V), caches)."""
    caches = model.init_caches(idx.size(0), idx.size(1))
    bounds = [0, *splits, *range(splits[-1] + 1, idx.size(1) + 1)]
    logits = [model(idx[:, a:b], caches=caches)[0] for a, b in zip(bounds, bounds[1:])]
    return torch.cat(logits, dim=1), caches


def set_attn_impl(model, impl):
    """Switch every layer of a built model to another attn_impl (e.g. naive, the reference)."""
    for block in model.h:
        block.attn.attn_impl = impl


def logits_and_grads(model, idx, impl):
    """Logits and {parameter name: gradient} of the loss on idx (its own targets), every layer on impl."""
    set_attn_impl(model, impl)
    model.zero_grad()
    logits, loss = model(idx, idx)
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def run_cli(argv, env=None):
    """`python ARGV` (argv[0] a script path or "-m", as a user types it) run in this process from
    the repo root, with os.environ updated by env (None values removed): -> (exit status, stdout,
    stderr). An uncaught exception is written to stderr as its traceback, status 1, as Python
    would. In-process, a check of a one-line refusal does not wait on importing torch again, so
    it takes the same time on a loaded machine as on an idle one (no subprocess timeout)."""
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    code = 0
    try:
        os.environ.update({k: v for k, v in (env or {}).items() if v is not None})
        for k in [k for k, v in (env or {}).items() if v is None]:
            os.environ.pop(k, None)
        os.chdir(ROOT)
        sys.argv = list(argv[1:]) if argv[0] == "-m" else list(argv)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")  # re-running a module
            try:
                if argv[0] == "-m":
                    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(os.path.join(ROOT, argv[0]), run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001  (what python would print, for the test to see)
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
    return code, out.getvalue(), err.getvalue()


@functools.cache
def cli_timeout():
    """Seconds a test gives a `python ...` subprocess: $TEST_CLI_TIMEOUT, else 120 plus 10 times
    what importing torch takes here now (measured once): ~95 s on a loaded 2-core machine, where
    a fixed 120 s failed checks that were right."""
    if os.environ.get("TEST_CLI_TIMEOUT"):
        return float(os.environ["TEST_CLI_TIMEOUT"])
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    return 120 + 10 * (time.perf_counter() - t0)
