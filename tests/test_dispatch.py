"""The implementation report (GPT.attn_impl_report, attention/dispatch.py) says what actually ran.

Each test spies on the kernel entry points (attn_kernels.flash_attn.flash_attention,
attn_kernels.gla.chunk_gla) and on PyTorch's SDPA, runs a forward, and checks the report against the
calls, not against the chooser's own bookkeeping. Triton cases run the kernel under the
interpreter on CPU (conftest sets TRITON_INTERPRET=1) and natively on CUDA.
"""
import pytest
import torch
import torch.nn.functional as F

from attention import VARIANTS, dispatch
from attn_kernels.env import available
from helpers import POS_ENCODINGS, accepts, set_attn_impl, tiny_model_kwargs
from model import GPT, GPTConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(not available(DEVICE), reason="Triton cannot run here")


@pytest.fixture
def calls(monkeypatch):
    """Counts of the calls that reached each implementation; stderr notes start afresh."""
    import attn_kernels.flash_attn
    import attn_kernels.gla
    seen = {"flash": 0, "gla_kernel": 0, "sdpa": 0}

    def spy(name, real):
        def wrapper(*args, **kwargs):
            seen[name] += 1
            return real(*args, **kwargs)
        return wrapper
    flash = attn_kernels.flash_attn
    monkeypatch.setattr(flash, "flash_attention", spy("flash", flash.flash_attention))
    monkeypatch.setattr(attn_kernels.gla, "chunk_gla", spy("gla_kernel", attn_kernels.gla.chunk_gla))
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy("sdpa", F.scaled_dot_product_attention))
    monkeypatch.setattr(dispatch, "_said", set())
    return seen


def run_model(n_layer=2, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=65, n_layer=n_layer, n_head=4, n_embd=64, **kw)
    model = GPT(cfg).to(DEVICE)
    idx = torch.randint(0, 65, (1, 20), device=DEVICE)
    model(idx[:, :-1], idx[:, 1:])
    return model


@needs_kernels
def test_triton_with_dropout_reports_and_runs_sdpa(calls, capsys):
    model = run_model(attention="mha", attn_impl="triton", dropout=0.1)
    assert calls["flash"] == 0 and calls["sdpa"] == 2
    assert model.attn_impl_report() == {"requested": "triton", "used": "sdpa", "why": "dropout > 0"}
    model(torch.zeros(1, 5, dtype=torch.long, device=DEVICE))
    notes = [line for line in capsys.readouterr().err.splitlines() if "dropout > 0" in line]
    assert len(notes) == 1  # said once, for all layers and forwards


@needs_kernels
def test_triton_without_dropout_reports_and_runs_the_kernel(calls):
    model = run_model(attention="gqa", n_kv_head=2, attn_impl="triton")
    assert calls["flash"] == 2 and calls["sdpa"] == 0
    assert model.attn_impl_report() == {"requested": "triton", "used": "triton", "why": None}


def test_auto_on_cpu_reports_and_runs_sdpa(calls):
    if DEVICE == "cuda":
        pytest.skip("auto picks the kernel on CUDA")
    model = run_model(attention="mha", attn_impl="auto")
    assert calls["flash"] == 0 and calls["sdpa"] == 2
    assert model.attn_impl_report() == {"requested": "auto", "used": "sdpa", "why": "auto runs PyTorch off CUDA"}


@needs_kernels
@pytest.mark.parametrize("gla_chunk,used", [(16, "triton"), (8, "sdpa")])
def test_gla_chunk_the_kernel_cannot_take_is_reported(calls, gla_chunk, used):
    """The full-sequence path runs the kernel or says why; one-token decoding steps the state in
    PyTorch whatever the chunk (reported as such)."""
    model = run_model(n_layer=1, attention="gla", attn_impl="triton", gla_chunk=gla_chunk)
    assert calls["gla_kernel"] == (used == "triton")
    report = model.attn_impl_report()
    assert report["used"] == ({"forward": "triton", "decode": "sdpa"} if used == "triton" else "sdpa")
    assert ("power of two" in report["why"]) == (used == "sdpa") and "one-token step" in report["why"]


@needs_kernels
def test_changing_attn_impl_changes_what_runs(calls):
    model = run_model(n_layer=1, attention="mha", attn_impl="triton")
    assert calls["flash"] == 1
    set_attn_impl(model, "naive")  # tests switch layers to the reference this way
    model(torch.zeros(1, 5, dtype=torch.long, device=DEVICE))
    assert calls["flash"] == 1 and calls["sdpa"] == 0
    assert model.attn_impl_report() == {"requested": "naive", "used": "naive", "why": None}


def test_mla_reports_each_path():
    """The absorbed decode form attends over d_c + d_r = 288 dims, past the kernel's 256; the
    training form over d_h + d_r = 96 (checked only where the kernels can run: that decides it)."""
    cfg = GPTConfig(block_size=16, vocab_size=65, n_layer=1, n_head=4, n_embd=256, attention="mla", attn_impl="triton")
    report = GPT(cfg).attn_impl_report(DEVICE)
    if available(DEVICE):
        assert report["used"] == {"forward": "triton", "absorbed": "sdpa"} and "288" in report["why"]
    else:
        assert report["used"] == "sdpa" and report["why"]


@needs_kernels
@pytest.mark.parametrize("dropout,used", [(0.1, "sdpa"), (0.0, "triton")])
def test_summary_json_records_what_ran_in_training(calls, data_root, tmp_path, dropout, used):
    """train.py's summary.json and header line carry the resolved implementation, and it is
    the one the spies saw during training."""
    import json

    import train
    from helpers import train_args
    train.main(train_args(data_root, tmp_path, "--max_iters=1", "--eval_interval=1", "--eval_iters=1",
                          "--attn_impl=triton", f"--dropout={dropout}"))
    with open(tmp_path / "summary.json") as f:
        record = json.load(f)["attn_impl"]
    assert record["requested"] == "triton" and record["used"] == used
    assert ("dropout > 0" in (record["why"] or "")) == (used == "sdpa")
    assert (calls["flash"] > 0) == (used == "triton") and (calls["sdpa"] > 0) == (used == "sdpa")


class _WindowAttention:
    """A masked variant built on QKVAttention as a user would write one: each query sees its
    last 3 keys through attend(keep=...). `declares_mask` says so in kernel_cases (or not)."""

    @staticmethod
    def make(declares_mask, **kw):
        from attention.base import QKVAttention, attend

        class Window(QKVAttention):
            def forward(self, x, pos, cache=None):
                q, k, v = self.project(x, pos)
                keep = (pos[:, None] - pos[None, :]) < 3
                return self.output(attend(q, k, v, pos, pos, keep=keep, impl=self.impl(x.device)))

            def kernel_cases(self):
                module, case = super().kernel_cases()["forward"]
                return {"forward": (module, {**case, "masked": True} if declares_mask else case)}

        cfg = GPTConfig(block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=16, bias=False, attn_impl="triton",
                        pos_encoding="none")
        return Window(cfg, 0)


@needs_kernels
def test_a_masked_path_never_runs_the_kernel_that_drops_the_mask(calls):
    """attn_impl=triton on a path with a keep mask: declared, dispatch picks PyTorch and says
    why, and the output equals explicit masked attention; undeclared, attend refuses in one
    line instead of calling the kernel (which would ignore the mask)."""
    import math
    torch.manual_seed(0)
    x, pos = torch.randn(1, 8, 16, device=DEVICE), torch.arange(8, device=DEVICE)
    layer = _WindowAttention.make(declares_mask=True).to(DEVICE)
    y = layer(x, pos)
    choice = layer.impl_choices(DEVICE)["forward"]
    assert choice.used == "sdpa" and "mask" in choice.why and calls["flash"] == 0
    # the reference: explicit scores, causal and window mask, per head
    W = layer.c_attn.weight
    q, k, v = (x @ W[i * 16:(i + 1) * 16].T for i in range(3))
    i, j = pos[:, None], pos[None, :]
    outs = []
    for h in range(2):
        s = q[..., h * 8:(h + 1) * 8] @ k[..., h * 8:(h + 1) * 8].transpose(-1, -2) / math.sqrt(8)
        s = s.masked_fill(~((j <= i) & (i - j < 3)), float("-inf"))
        outs.append(s.softmax(-1) @ v[..., h * 8:(h + 1) * 8])
    torch.testing.assert_close(y, torch.cat(outs, -1) @ layer.c_proj.weight.T, atol=1e-5, rtol=1e-5)

    undeclared = _WindowAttention.make(declares_mask=False).to(DEVICE)
    assert undeclared.impl(DEVICE) == "triton"
    with pytest.raises(ValueError, match="no element mask") as e:
        undeclared(x, pos)
    assert len(str(e.value).splitlines()) == 1 and calls["flash"] == 0


@pytest.mark.parametrize("attention", [*VARIANTS, "gla,mha", "moba,bigbird"])
def test_triton_requested_every_path_runs_it_or_says_why(attention, monkeypatch, capsys):
    """Each registered variant (and hybrid plans), at its defaults (gqa: 2 KV heads): every path its layers declare
    gets triton or PyTorch with a reason, the report joins those reasons, and stderr says each
    fallback once, however often the layers decide."""
    monkeypatch.setattr(dispatch, "_said", set())
    kw = dict(attention=attention, attn_impl="triton", **({"n_kv_head": 2} if attention == "gqa" else {}))
    pos_encoding = next((p for p in POS_ENCODINGS if accepts(pos_encoding=p, **kw)), "rope")  # else: its refusal
    model = GPT(GPTConfig(**tiny_model_kwargs(pos_encoding=pos_encoding, **kw)))
    for _ in range(2):
        set_attn_impl(model, "triton")  # a fresh request: every layer decides (and would say it) again
        report = model.attn_impl_report(DEVICE)
    layers = [b.attn.impl_choices(DEVICE) for b in model.h]
    assert all(layer.keys() == b.attn.kernel_cases().keys() for layer, b in zip(layers, model.h))
    fallbacks = [c for layer in layers for c in layer.values() if c.used != "triton"]
    assert all(c.requested == "triton" and c.used == "sdpa" and c.why for c in fallbacks)
    assert (report["why"] is None) == (not fallbacks) and all(c.why in report["why"] for c in fallbacks)
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == len(set(notes)) and all(any(c.why in n for n in notes) for c in fallbacks)
    if attention == "moba":  # no path of moba runs a kernel: the two masked ones and the gathered one
        assert set(layers[0]) == {"forward", "decode", "gathered"} and len(fallbacks) == 3 * len(layers)
