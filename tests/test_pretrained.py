"""pretrained.from_pretrained against Hugging Face's GPT2LMHeadModel: a random tiny GPT-2
saved with save_pretrained loads with the same logits and greedy tokens; GQA/MQA conversion is
exact for identical heads in a group and the group mean otherwise; MLA conversion is exact when
the stacked K/V map has rank <= kv_lora_rank, and its printed error matches numpy's SVD; the hub
names ask for the right files; bad inputs are one-line errors (exit 2 through sample.py)."""
import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel

import pretrained
from pretrained import from_pretrained

C, H, D, LAYERS = 32, 4, 8, 2     # the tiny GPT-2 below: 4 heads of 8


def tiny_gpt2(vocab_size=97, activation="gelu_new", eps=1e-5, edit=None, seed=0):
    """A random GPT-2 with non-trivial biases and LayerNorm gains; edit(sd) may reshape its c_attn
    (Conv1D: weight (in, out) with out = [q | k | v], heads of D columns each)."""
    torch.manual_seed(seed)
    cfg = GPT2Config(n_embd=C, n_head=H, n_layer=LAYERS, n_positions=48, vocab_size=vocab_size,
                     activation_function=activation, layer_norm_epsilon=eps, bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if "ln" in name else 0.05))
        if edit is not None:
            for block in hf.transformer.h:
                edit(block.attn.c_attn)
    return hf


def save(hf, folder):
    hf.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def hf_greedy(hf, idx, n):
    """Greedy decoding by the reference: argmax of its full forward, one token at a time."""
    for _ in range(n):
        idx = torch.cat([idx, hf(idx).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def reported_errors(stderr):
    return [float(x) for x in re.findall(r"relative K/V error (\S+)", stderr)]


def kv_affine(c_attn):
    """The reference's stacked K/V map [W_k; W_v | b_k; b_v] as (2C, C+1) rows per output feature."""
    w, b = c_attn.weight.detach().T, c_attn.bias.detach()             # Conv1D -> (out, in)
    return torch.cat([w, b[:, None]], dim=1)[C:].double().numpy()


@pytest.mark.parametrize("activation,eps", [("gelu_new", 1e-5), ("gelu", 1e-3)])
def test_logits_and_greedy_tokens_equal_transformers(tmp_path, activation, eps):
    hf = tiny_gpt2(activation=activation, eps=eps)
    model = from_pretrained(save(hf, tmp_path)).eval()
    assert model.config.gelu_approximate == ("tanh" if activation == "gelu_new" else "none")
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        want = hf(idx).logits
        got, _ = model(idx)
        assert (got - want).abs().max().item() <= 1e-4
        assert torch.equal(model.generate(idx[:, :5], 24, temperature=0), hf_greedy(hf, idx[:, :5], 24))


def test_block_size_crop_keeps_the_first_positions(tmp_path):
    hf = tiny_gpt2()
    model = from_pretrained(save(hf, tmp_path), block_size=16, dropout=0.1).eval()
    assert model.wpe.weight.shape == (16, C) and model.config.dropout == 0.1
    idx = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-4


def group_identical_heads(group_size):
    """edit: copy the first K and V head of each group of `group_size` heads onto the others."""
    def edit(c_attn):
        for part in (1, 2):                                           # k, v
            for h in range(H):
                cols = slice(part * C + h * D, part * C + (h + 1) * D)
                first = h - h % group_size
                first_cols = slice(part * C + first * D, part * C + (first + 1) * D)
                c_attn.weight[:, cols] = c_attn.weight[:, first_cols].clone()
                c_attn.bias[cols] = c_attn.bias[first_cols].clone()
    return edit


@pytest.mark.parametrize("attention,n_kv_head", [("gqa", 2), ("mqa", 1)])
def test_gqa_mqa_conversion_exact_when_group_heads_are_equal(tmp_path, capfd, attention, n_kv_head):
    hf = tiny_gpt2(edit=group_identical_heads(H // n_kv_head))
    model = from_pretrained(save(hf, tmp_path), attention=attention, n_kv_head=n_kv_head).eval()
    assert model.h[0].attn.c_attn.weight.shape == ((H + 2 * n_kv_head) * D, C)
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-4
    assert reported_errors(capfd.readouterr().err) == [0.0] * LAYERS


def test_gqa_conversion_is_the_group_mean_and_reports_its_error(tmp_path, capfd):
    hf = tiny_gpt2()
    model = from_pretrained(save(hf, tmp_path), attention="gqa", n_kv_head=2)
    errors = reported_errors(capfd.readouterr().err)
    for layer, block in enumerate(hf.transformer.h):
        w, b = block.attn.c_attn.weight.detach(), block.attn.c_attn.bias.detach()
        got_w, got_b = model.h[layer].attn.c_attn.weight.detach(), model.h[layer].attn.c_attn.bias.detach()
        assert torch.equal(got_w[:C], w[:, :C].T)                     # queries untouched
        exact, seen = [], []
        for part in (1, 2):
            for g in range(2):
                heads = [slice(part * C + h * D, part * C + (h + 1) * D) for h in (2 * g, 2 * g + 1)]
                mean_w = sum(w[:, s].T for s in heads) / 2
                mean_b = sum(b[s] for s in heads) / 2
                row = C + (part - 1) * 2 * D + g * D
                assert (got_w[row:row + D] - mean_w).abs().max().item() <= 1e-6
                assert (got_b[row:row + D] - mean_b).abs().max().item() <= 1e-6
                for s in heads:
                    exact.append(torch.cat([w[:, s].T, b[s, None]], 1))
                    seen.append(torch.cat([mean_w, mean_b[:, None]], 1))
        want = (torch.cat(exact) - torch.cat(seen)).norm() / torch.cat(exact).norm()
        assert errors[layer] == pytest.approx(want.item(), rel=1e-4)


def low_rank_kv(rank):
    """edit: make the stacked [W_k; W_v | b_k; b_v] map a product of rank `rank`."""
    def edit(c_attn):
        m = torch.randn(2 * C, rank) @ torch.randn(rank, C + 1) * 0.05
        c_attn.weight[:, C:] = m[:, :C].T
        c_attn.bias[C:] = m[:, C]
    return edit


def test_mla_conversion_exact_when_kv_rank_fits(tmp_path, capfd):
    hf = tiny_gpt2(edit=low_rank_kv(12))
    model = from_pretrained(save(hf, tmp_path), attention="mla", kv_lora_rank=12).eval()
    assert not model.config.mla_latent_norm and model.config.rope_head_dim == 0
    assert model.cache_elems_per_token() == 12 * LAYERS
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        want = hf(idx).logits
        assert (model(idx)[0] - want).abs().max().item() <= 1e-4
        # decoding from the latent cache (absorbed) gives the same tokens as the reference
        assert torch.equal(model.generate(idx[:, :5], 20, temperature=0), hf_greedy(hf, idx[:, :5], 20))
    assert max(reported_errors(capfd.readouterr().err)) <= 1e-6


@pytest.mark.parametrize("rank", [5, 20])
def test_mla_conversion_error_matches_numpy_svd(tmp_path, capfd, rank):
    hf = tiny_gpt2()
    model = from_pretrained(save(hf, tmp_path), attention="mla", kv_lora_rank=rank)
    errors = reported_errors(capfd.readouterr().err)
    for layer, block in enumerate(hf.transformer.h):
        s = np.linalg.svd(kv_affine(block.attn.c_attn), compute_uv=False)
        assert errors[layer] == pytest.approx(np.sqrt((s[rank:] ** 2).sum() / (s ** 2).sum()), rel=1e-4)
        # and the converted layer's K/V map is that rank-r approximation
        attn = model.h[layer].attn
        down = torch.cat([attn.kv_down.weight, attn.kv_down.bias[:, None]], 1)
        up = torch.cat([attn.k_up.weight, attn.v_up.weight])
        got = (up @ down).detach().double().numpy()
        resid = np.linalg.norm(kv_affine(block.attn.c_attn) - got) / np.linalg.norm(kv_affine(block.attn.c_attn))
        assert resid == pytest.approx(errors[layer], rel=1e-3)


def test_hub_names_download_config_and_safetensors(tmp_path, monkeypatch):
    import huggingface_hub
    folder = save(tiny_gpt2(), tmp_path)
    asked = []

    def fake_download(repo_id, filename, **kw):
        asked.append((repo_id, filename))
        return f"{folder}/{filename}"
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    from_pretrained("gpt2-medium")
    assert asked == [("openai-community/gpt2-medium", "config.json"), ("openai-community/gpt2-medium",
                                                                       "model.safetensors")]


def test_overrides_from_keys_of_the_uptrain_config(tmp_path):
    """What train.py passes for config/uptrain_gqa.py: the conversion and crop, and GPT-2's own values."""
    from trainer.settings import parse_keys
    argv = ["config/uptrain_gqa.py", "--mla_latent_norm=True"]
    by_default = pretrained.overrides_from_keys(parse_keys(argv))
    assert by_default == {"attention": "gqa", "n_kv_head": 4, "block_size": 256, "bias": True,
                          "gelu_approximate": "tanh", "pos_encoding": "learned"}
    explicit = set()
    got = pretrained.overrides_from_keys(parse_keys(argv, explicit), explicit)
    assert got == {**by_default, "n_layer": 12, "n_head": 12, "n_embd": 768, "dropout": 0.0,
                   "mla_latent_norm": True}   # set by the user, even where equal to the default


def write_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("name,overrides,words", [
    ("gpt5", {}, "neither a GPT-2 name"),
    ("EMPTY", {}, "lacks config.json and model.safetensors"),
    ("LLAMA", {}, "model_type='llama', not gpt2"),
    ("FOLDER", {"attention": "gqa", "n_kv_head": 3}, "n_head % n_kv_head == 0"),
    ("FOLDER", {"attention": "mla", "kv_lora_rank": 2 * C + 1}, "kv_lora_rank=65 is larger than the K/V width"),
    ("FOLDER", {"attention": "gla"}, "cannot be converted"),
    ("FOLDER", {"n_layer": 3}, "n_layer=3 cannot change"),
    ("FOLDER", {"block_size": 49}, "block_size=49 exceeds"),
    ("FOLDER", {"widget": 1}, "unknown model key widget"),
])
def test_bad_inputs_are_one_line_value_errors(tmp_path, name, overrides, words):
    folder = tmp_path / "m"
    save(tiny_gpt2(), folder)
    (tmp_path / "empty").mkdir()
    if name == "LLAMA":
        write_config(folder, model_type="llama")
    name = {"EMPTY": str(tmp_path / "empty"), "LLAMA": str(folder), "FOLDER": str(folder)}.get(name, name)
    for load in (from_pretrained, pretrained.pretrained_config):   # the weights, or the config alone
        with pytest.raises(ValueError, match=re.escape(words)) as err:
            load(name, **overrides)
        assert "\n" not in str(err.value)


def test_sample_py_greedy_equals_reference_and_bad_input_exits_2(tmp_path, capsys, gpt2_vocab):
    """GPT-2's vocabulary so that tiktoken's gpt2 encoding applies ($TIKTOKEN_CACHE_DIR offline)."""
    import tiktoken

    import sample
    hf = tiny_gpt2(vocab_size=50257)
    folder = save(hf, tmp_path)
    capsys.readouterr()
    sample.main([f"--init_from={folder}", "--start=Hello, I am", "--max_new_tokens=12", "--temperature=0"])
    enc = tiktoken.get_encoding("gpt2")
    prompt = torch.tensor([enc.encode("Hello, I am")])
    with torch.no_grad():
        want = enc.decode(hf_greedy(hf, prompt, 12)[0].tolist())
    assert capsys.readouterr().out == want + "\n---------------\n"
    for bad in ([f"--init_from={folder}", "--attention=mla", f"--kv_lora_rank={10 * C}"], ["--init_from=gpt5"]):
        with pytest.raises(SystemExit) as code:
            sample.main(bad)
        assert code.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and len(err.splitlines()) == 1


@pytest.mark.parametrize("attention", ["mha", "gqa"])
def test_train_py_init_from_a_folder_evaluates_as_the_reference_then_trains(data_root, tmp_path, attention):
    """train.py --init_from=FOLDER: the first evaluation equals GPT2LMHeadModel's loss on the same
    windows (exact for mha; gqa is a converted model, so only close); it trains, saves the
    converted config, and resumes; a dataset of another vocabulary is refused in one line."""
    import subprocess
    import sys

    import train
    from helpers import ROOT, train_args
    from trainer.batches import Batches
    hf = tiny_gpt2(vocab_size=65)
    folder = save(hf, tmp_path / "gpt2")
    out = tmp_path / "run"
    extra = ["--n_embd=32", "--n_head=4", "--n_layer=2", "--block_size=32", "--eval_interval=4", "--max_iters=4"]
    if attention == "gqa":
        extra += ["--attention=gqa", "--n_kv_head=2"]
    train.main(train_args(data_root, out, f"--init_from={folder}", *extra))
    with open(out / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    meta = json.loads((data_root / "shakespeare_char" / "meta.json").read_text())
    windows = Batches(str(data_root / "shakespeare_char"), meta, 32, 8, "cpu", 1337).eval_windows("val", 5)
    with torch.no_grad():
        ref = sum(torch.nn.functional.cross_entropy(hf(X).logits.flatten(0, 1), Y.flatten()).item()
                  for X, Y, _ in windows) / 5
    assert abs(log[0]["val_loss"] - ref) < (1e-4 if attention == "mha" else 0.5), (log[0], ref)
    assert log[-1]["iter"] == 4 and log[-1]["val_loss"] < log[0]["val_loss"]
    args = torch.load(out / "ckpt.pt", weights_only=True)["model_args"]
    assert (args["attention"], args["pos_encoding"], args["bias"], args["gelu_approximate"]) == \
        (attention, "learned", True, "tanh")
    train.main(train_args(data_root, out, "--init_from=resume", *extra[:4], "--max_iters=8"))
    other = tmp_path / "data2" / "shakespeare_char"
    other.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (other / name).write_bytes((data_root / "shakespeare_char" / name).read_bytes())
    (other / "meta.json").write_text(json.dumps({**meta, "vocab_size": 100, "chars": meta["chars"] + ["?"] * 35}))
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, tmp_path / "x", f"--init_from={folder}",
                                                                *extra, f"--data_dir={other.parent}")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "vocab_size=65" in r.stderr, r.stderr
