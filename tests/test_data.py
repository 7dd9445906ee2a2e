"""The data scripts: tokens equal a direct tiktoken / character encoding of the same text, whatever
--num_proc and chunk size; the Hugging Face path works offline on local parquet / jsonl /
save_to_disk data; a run that stops midway leaves nothing half-written (and resumes after
Ctrl-C); bad input is one line with exit status 2; meta.json drives train.py and sample.py,
uint32 included.

Offline: TIKTOKEN_CACHE_DIR must hold the gpt2 encoding (CI points it at a local cache) and
TINYSHAKESPEARE_INPUT at the text (without it the text is downloaded).
"""
import ast
import json
import os
import re
import runpy
import subprocess
import sys

# Never touch the Hugging Face Hub from the tests (read by `datasets` when it is imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tiktoken  # noqa: E402

from data import errors, text_source, tokenizers, writer  # noqa: E402
from helpers import ROOT, train_args  # noqa: E402

SHAKESPEARE = os.path.join(ROOT, "data/shakespeare/prepare.py")
SHAKESPEARE_CHAR = os.path.join(ROOT, "data/shakespeare_char/prepare.py")
TEXT = os.path.join(ROOT, "data/text/prepare.py")
OWT = os.path.join(ROOT, "data/openwebtext/prepare.py")
FINEWEB = os.path.join(ROOT, "data/fineweb/prepare.py")
SEED = 2357  # the scripts' default --seed


@pytest.fixture(scope="module")
def text(shakespeare_input):
    with open(shakespeare_input, encoding="utf-8", newline="") as f:
        return f.read()


@pytest.fixture(scope="module")
def text_file(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "input.txt"
    path.write_bytes(text.encode("utf-8"))
    return str(path)


@pytest.fixture(scope="module")
def enc(gpt2_vocab):
    return tiktoken.get_encoding("gpt2")


@pytest.fixture(scope="module")
def docs(text):
    """Documents: the paragraphs of the first half of Tiny Shakespeare."""
    return text[:len(text) // 2].split("\n\n")


@pytest.fixture(scope="module")
def gpt2_root(text_file, tmp_path_factory):
    """A data_dir holding shakespeare/ made by the real command line, with two processes."""
    root = tmp_path_factory.mktemp("data")
    r = subprocess.run([sys.executable, SHAKESPEARE, "--input", text_file, "--out_dir", str(root / "shakespeare"),
                        "--num_proc=2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return root


def read_bins(out_dir):
    meta = json.load(open(os.path.join(out_dir, "meta.json")))
    dt = np.dtype(meta["dtype"])
    split = {s: np.fromfile(os.path.join(out_dir, f"{s}.bin"), dtype=dt) for s in ("train", "val")}
    return split["train"], split["val"], meta


def run_inprocess(monkeypatch, script, *args):
    """Run a prepare script as `python script args...` in this process; its exit status."""
    monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return e.code
    return 0


def leftovers(out_dir):
    """Temporary or state files a run left in out_dir."""
    return sorted(f for f in os.listdir(out_dir) if ".tmp" in f or f == writer.STATE_FILE) \
        if os.path.isdir(out_dir) else []


def write_jsonl(path, texts):
    with open(path, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    return str(path)


def expected_split(enc, texts, val_fraction, seed=SEED):
    """Independent reference: each document's gpt2 tokens + <|endoftext|>; document i is validation
    when the i-th draw of numpy's default_rng(seed) is below val_fraction (the documented rule)."""
    ids = [enc.encode_ordinary(t) + [enc.eot_token] for t in texts]
    to_val = np.random.default_rng(seed).random(len(texts)) < val_fraction
    pick = lambda v: [i for doc, tv in zip(ids, to_val) for i in doc if tv == v]  # noqa: E731
    return pick(False), pick(True)


# ---------------------------------------------------------------- dtype

def test_dtype_is_uint16_when_the_vocabulary_fits_else_uint32():
    assert tokenizers.choose_dtype(65) == tokenizers.choose_dtype(50257) == tokenizers.choose_dtype(65536) == "uint16"
    assert tokenizers.choose_dtype(65537) == tokenizers.choose_dtype(100277) == \
        tokenizers.choose_dtype(200019) == "uint32"
    assert tokenizers.choose_dtype(50257, "uint32") == "uint32"
    with pytest.raises(errors.InputError, match="cannot hold"):
        tokenizers.choose_dtype(100277, "uint16")
    assert np.iinfo(np.uint16).max == 65535  # ids 0..65535 fit: vocab_size 65536 is the last uint16 one


# ---------------------------------------------------------------- local text

def test_shakespeare_gpt2_round_trips_exactly(gpt2_root, text, enc):
    train, val, meta = read_bins(gpt2_root / "shakespeare")
    assert meta["tokenizer"] == "tiktoken:gpt2" and meta["vocab_size"] == 50257 and meta["dtype"] == "uint16"
    assert train.dtype == np.uint16 and meta["train_tokens"] == len(train) and meta["val_tokens"] == len(val)
    ids = np.concatenate([train, val]).tolist()
    assert len(ids) == len(enc.encode_ordinary(text)) + 1  # one document, one <|endoftext|>
    assert ids == enc.encode_ordinary(text) + [enc.eot_token]
    assert enc.decode(ids) == text + "<|endoftext|>"
    assert enc.decode(train.tolist()) + enc.decode(val.tolist()) == text + "<|endoftext|>"
    assert 0.08 < len(val) / len(ids) < 0.13  # the last ~10% of the text
    assert sorted(os.listdir(gpt2_root / "shakespeare")) == ["meta.json", "train.bin", "val.bin"]


@pytest.mark.parametrize("tokenizer", ["gpt2", "r50k_base", "char"])
def test_text_tokens_do_not_depend_on_chunking(monkeypatch, tmp_path, text, tokenizer):
    """Small chunks force hundreds of cuts, a line with no break, CRLF and non-ASCII text."""
    files = {"a.txt": text[:300_000], "b.txt": "caf\u00e9  na\u00efve\r\n\r\n  \u2014 ok\r\nx" * 500 + "y" * 9000,
             "c.txt": "", "d.txt": "last words\n\n\n"}
    for name, t in files.items():
        (tmp_path / "in" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(t.encode("utf-8"))
    monkeypatch.setattr(tokenizers, "CHUNK_CHARS", 3000)
    out = tmp_path / "out"
    assert run_inprocess(monkeypatch, TEXT, "--input", tmp_path / "in", "--out_dir", out, "--tokenizer", tokenizer,
                         "--num_proc=1", "--val_fraction=0.2") == 0
    train, val, meta = read_bins(out)
    whole = "".join(files.values())
    if tokenizer == "char":
        chars = sorted(set(whole))
        expected = [chars.index(c) for c in whole]
        assert meta["chars"] == chars and meta["vocab_size"] == len(chars)
    else:
        e = tiktoken.get_encoding(tokenizer)
        expected = [i for t in files.values() for i in e.encode_ordinary(t) + [e.eot_token]]
        assert meta["eot_token"] == e.eot_token
    assert np.concatenate([train, val]).tolist() == expected
    assert 0.15 < len(val) / len(expected) < 0.25 and meta["documents"] == 4


def test_char_with_forced_uint32(monkeypatch, tmp_path, text_file, text):
    out16, out32 = tmp_path / "c16", tmp_path / "c32"
    for out, dtype in ((out16, "uint16"), (out32, "uint32")):
        assert run_inprocess(monkeypatch, TEXT, "--input", text_file, "--out_dir", out, "--tokenizer=char",
                             f"--dtype={dtype}", "--num_proc=2") == 0
    t16, v16, m16 = read_bins(out16)
    t32, v32, m32 = read_bins(out32)
    assert m32["dtype"] == "uint32" and t32.dtype == np.uint32 and os.path.getsize(out32 / "train.bin") == 4 * len(t32)
    assert t16.tolist() == t32.tolist() and v16.tolist() == v32.tolist()
    assert "".join(m32["chars"][i] for i in np.concatenate([t32, v32])) == text


# ---------------------------------------------------------------- exact bytes, and how the scripts find the package

def uint16_bytes(ids):
    return np.asarray(ids, dtype="<u2").tobytes()


def shakespeare_split(text):
    """The documented split of one text: the last 10% is validation, starting after the first line break
    (between two non-space characters) at or past 90% of the characters."""
    return re.compile(r"(?<=\S)\n(?=\S)").search(text, round(len(text) * 0.9)).end()


def assert_output_bytes(out_dir, train_ids, val_ids, meta, indent):
    """train.bin / val.bin as little-endian uint16 ids and meta.json exactly as json.dump writes `meta`."""
    assert (out_dir / "train.bin").read_bytes() == uint16_bytes(train_ids)
    assert (out_dir / "val.bin").read_bytes() == uint16_bytes(val_ids)
    assert (out_dir / "meta.json").read_text() == json.dumps(meta, indent=indent)


def test_shakespeare_char_output_is_byte_exact(tmp_path, text, text_file):
    """The real command from another folder, relative --out_dir: nothing depends on the current folder."""
    r = subprocess.run([sys.executable, SHAKESPEARE_CHAR, "--input", text_file, "--out_dir", "out"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    cut = shakespeare_split(text)
    train, val = [index[c] for c in text[:cut]], [index[c] for c in text[cut:]]
    meta = {"vocab_size": len(chars), "dtype": "uint16", "tokenizer": "char", "chars": chars,
            "train_tokens": len(train), "val_tokens": len(val), "documents": 1, "source": [text_file],
            "val_fraction": 0.1}
    assert_output_bytes(tmp_path / "out", train, val, meta, indent=None)


def test_shakespeare_gpt2_output_is_byte_exact(gpt2_root, text, text_file, enc):
    cut = shakespeare_split(text)
    train, val = enc.encode_ordinary(text[:cut]), enc.encode_ordinary(text[cut:]) + [enc.eot_token]
    assert train + val == enc.encode_ordinary(text) + [enc.eot_token]  # the cut changes no token
    meta = {"vocab_size": 50257, "dtype": "uint16", "tokenizer": "tiktoken:gpt2", "eot_token": 50256,
            "train_tokens": len(train), "val_tokens": len(val), "documents": 1, "source": [text_file],
            "val_fraction": 0.1}
    assert_output_bytes(gpt2_root / "shakespeare", train, val, meta, indent=1)


def test_hf_output_is_byte_exact(tmp_path, enc, docs):
    source = write_jsonl(tmp_path / "docs.jsonl", docs[:400])
    r = subprocess.run([sys.executable, OWT, "--input", source, "--out_dir", str(tmp_path / "out"), "--num_proc=1",
                        "--val_fraction=0.1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    train, val = expected_split(enc, docs[:400], 0.1)
    meta = {"vocab_size": 50257, "dtype": "uint16", "tokenizer": "tiktoken:gpt2", "eot_token": 50256,
            "train_tokens": len(train), "val_tokens": len(val), "source": source, "name": None, "split": "train",
            "val_split": None, "val_fraction": 0.1, "seed": SEED, "text_field": "text", "max_tokens": 0}
    assert_output_bytes(tmp_path / "out", train, val, meta, indent=1)


def test_data_code_does_not_touch_sys_path():
    """The prepare scripts reach the data package through data/bootstrap.py: no code under data/ uses sys.path."""
    uses = []
    for folder, _, names in os.walk(os.path.join(ROOT, "data")):
        for path in (os.path.join(folder, n) for n in names if n.endswith(".py")):
            uses += [f"{os.path.relpath(path, ROOT)}:{node.lineno}" for node in ast.walk(ast.parse(open(path).read()))
                     if isinstance(node, ast.Attribute) and node.attr == "path" and
                     isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert uses == []


# ---------------------------------------------------------------- Hugging Face datasets

@pytest.mark.parametrize("fmt,num_proc", [("jsonl", 1), ("parquet", 2), ("save_to_disk", 1)])
def test_hf_local_data_matches_direct_tokenization(monkeypatch, tmp_path, enc, docs, fmt, num_proc):
    import datasets
    if fmt == "jsonl":
        source = write_jsonl(tmp_path / "docs.jsonl", docs)
    elif fmt == "parquet":
        source = str(tmp_path / "parquet")
        os.mkdir(source)  # a folder of two files, read in name order
        half = len(docs) // 2
        datasets.Dataset.from_dict({"text": docs[:half]}).to_parquet(os.path.join(source, "part-0.parquet"))
        datasets.Dataset.from_dict({"text": docs[half:]}).to_parquet(os.path.join(source, "part-1.parquet"))
    else:
        source = str(tmp_path / "disk")
        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs, "n": list(range(len(docs)))})}
                             ).save_to_disk(source)
    monkeypatch.setattr(tokenizers, "CHUNK_CHARS", 20_000)  # many tasks in flight
    out = tmp_path / "out"
    assert run_inprocess(monkeypatch, OWT, "--input", source, "--out_dir", out, f"--num_proc={num_proc}",
                         "--val_fraction=0.1") == 0
    train, val, meta = read_bins(out)
    exp_train, exp_val = expected_split(enc, docs, 0.1)
    assert train.tolist() == exp_train and val.tolist() == exp_val
    assert meta["tokenizer"] == "tiktoken:gpt2" and meta["vocab_size"] == 50257 and meta["eot_token"] == 50256
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_hf_max_tokens_and_val_split(monkeypatch, tmp_path, enc, docs):
    import datasets
    source = str(tmp_path / "disk")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": docs[:-100]}),
                          "validation": datasets.Dataset.from_dict({"body": docs[-100:]})}).save_to_disk(source)
    monkeypatch.setattr(tokenizers, "CHUNK_CHARS", 5_000)
    out = tmp_path / "out"
    assert run_inprocess(monkeypatch, FINEWEB, "--dataset", source, "--val_split=validation", "--text_field=body",
                         "--max_tokens=20000", "--num_proc=1", "--out_dir", out) == 0
    train, val, meta = read_bins(out)

    def first_docs(texts, cap):  # whole documents, up to the one that reaches cap tokens
        ids, kept = [enc.encode_ordinary(t) + [enc.eot_token] for t in texts], []
        for d in ids:
            kept += d
            if len(kept) >= cap:
                break
        return kept

    assert train.tolist() == first_docs(docs[:-100], 20000) and 20000 <= len(train) < 21000
    assert val.tolist() == first_docs(docs[-100:], 20000)  # the cap applies to each split read
    assert meta["val_split"] == "validation" and meta["max_tokens"] == 20000


def test_hf_small_slice_still_has_a_validation_document(monkeypatch, tmp_path, enc, docs, capsys):
    """0.05% of 20 documents draws none: the last document becomes the validation split."""
    source = write_jsonl(tmp_path / "docs.jsonl", docs[:20])
    out = tmp_path / "out"
    assert run_inprocess(monkeypatch, OWT, "--input", source, "--out_dir", out, "--num_proc=1") == 0
    train, val, _ = read_bins(out)
    ids = [enc.encode_ordinary(t) + [enc.eot_token] for t in docs[:20]]
    assert val.tolist() == ids[-1] and train.tolist() == [i for d in ids[:-1] for i in d]
    assert "drew no document" in capsys.readouterr().err


def test_hf_bad_document_midway_leaves_nothing_behind(monkeypatch, tmp_path, docs, capsys):
    source = write_jsonl(tmp_path / "docs.jsonl", docs)
    out = tmp_path / "out"
    assert run_inprocess(monkeypatch, OWT, "--input", source, "--out_dir", out, "--num_proc=1",
                         "--val_fraction=0.1") == 0
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}

    bad = write_jsonl(tmp_path / "bad.jsonl", docs[:-3] + [None] + docs[-2:])  # a null text, late
    monkeypatch.setattr(tokenizers, "CHUNK_CHARS", 10_000)
    writes = []
    real_write = writer.Output.write
    monkeypatch.setattr(writer.Output, "write",
                        lambda self, s, ids: (writes.append(len(ids)), real_write(self, s, ids)))
    for target, num_proc in ((out, 2), (tmp_path / "fresh", 1)):
        capsys.readouterr()
        assert run_inprocess(monkeypatch, OWT, "--input", bad, "--out_dir", target, f"--num_proc={num_proc}",
                             "--val_fraction=0.1") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: document") and f"document {len(docs) - 3} " in err[-1]
        assert "--text_field" in err[-1] and not any("Traceback" in line for line in err)
    assert sum(writes) > 50_000  # it did fail midway, after writing tokens
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before  # the earlier output is untouched
    assert not os.path.exists(tmp_path / "fresh")  # the folder it created is gone, temporary files with it


def test_hf_resumes_after_an_interruption(monkeypatch, tmp_path, enc, docs, capsys):
    source = write_jsonl(tmp_path / "docs.jsonl", docs)
    monkeypatch.setattr(tokenizers, "CHUNK_CHARS", 10_000)
    out = tmp_path / "out"
    real_write, calls = writer.Output.write, []

    def interrupting_write(self, split, ids):
        calls.append(split)
        if len(calls) == 16:  # Ctrl-C between a task's val and train writes: resuming must cut val back
            raise KeyboardInterrupt
        real_write(self, split, ids)

    monkeypatch.setattr(writer.Output, "write", interrupting_write)
    assert run_inprocess(monkeypatch, OWT, "--input", source, "--out_dir", out, "--num_proc=1",
                         "--val_fraction=0.1") == 130
    assert "run the same command again to resume" in capsys.readouterr().err
    assert not os.path.exists(out / "train.bin") and writer.STATE_FILE in os.listdir(out)
    monkeypatch.setattr(writer.Output, "write", real_write)
    assert run_inprocess(monkeypatch, OWT, "--input", source, "--out_dir", out, "--num_proc=2",
                         "--val_fraction=0.1") == 0
    assert "resuming an interrupted run at document" in capsys.readouterr().err
    train, val, _ = read_bins(out)
    exp_train, exp_val = expected_split(enc, docs, 0.1)
    assert train.tolist() == exp_train and val.tolist() == exp_val
    assert leftovers(out) == []


# ---------------------------------------------------------------- bad input

@pytest.fixture
def inputs(tmp_path, docs):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (tmp_path / "a_file").write_text("x")
    write_jsonl(tmp_path / "docs.jsonl", docs[:50])
    (tmp_path / "ok.txt").write_text("hello world\n" * 20)
    (tmp_path / "abc.txt").write_text("abc")
    return tmp_path


@pytest.mark.parametrize("script,args,words", [
    (TEXT, ["--input", "{d}/missing.txt"], "missing.txt does not exist"),
    (TEXT, [], "no input"),
    (TEXT, ["--input", "{d}/empty.txt"], "input is empty"),
    (TEXT, ["--input", "{d}/latin1.txt"], "is not UTF-8"),
    (TEXT, ["--input", "{d}/ok.txt", "--tokenizer=gpt3"], "unknown tokenizer 'gpt3'"),
    (TEXT, ["--input", "{d}/ok.txt", "--val_fraction=1.5"], "--val_fraction"),
    (TEXT, ["--input", "{d}/ok.txt", "--out_dir={d}/a_file/sub"], "cannot write to --out_dir"),
    (TEXT, ["--input", "{d}/abc.txt", "--tokenizer=char", "--test_fraction=0.1"], "test.bin would be empty"),
    (TEXT, ["--input", "{d}/abc.txt", "--tokenizer=char", "--test_fraction=1e-300"], "test.bin would be empty"),
    (TEXT, ["--input", "{d}/abc.txt", "--tokenizer=char", "--test_fraction=0.5"], "would get 2 and val.bin 0"),
    (SHAKESPEARE, ["--input", "{d}/missing.txt"], "does not exist"),
    (OWT, ["--input", "{d}/missing.jsonl"], "missing.jsonl does not exist"),
    (OWT, ["--input", "{d}/empty.jsonl"], "holds no documents"),
    (OWT, ["--input", "{d}/docs.jsonl", "--text_field=body"], "has no field 'body'"),
    (OWT, ["--input", "{d}/docs.jsonl", "--text_field=id"], "not text"),
    (OWT, ["--input", "{d}/docs.jsonl", "--tokenizer=gpt3"], "unknown tokenizer 'gpt3'"),
    (OWT, ["--input", "{d}/docs.jsonl", "--tokenizer=char"], "data/text/prepare.py"),
    (OWT, ["--input", "{d}/docs.jsonl", "--split=validation"], "single split"),
    (OWT, ["--input", "{d}/docs.jsonl", "--max_tokens=lots"], "--max_tokens"),
    (OWT, ["--input", "{d}/docs.jsonl", "--out_dir={d}/a_file/sub"], "cannot write to --out_dir"),
    (FINEWEB, ["--dataset=./no/such/folder"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, inputs, script, args, words):
    out = inputs / "out"
    args = [a.format(d=inputs) for a in args]
    if not any(a.startswith("--out_dir") for a in args):
        args += ["--out_dir", str(out)]
    assert run_inprocess(monkeypatch, script, *args, "--num_proc=1") == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert not os.path.exists(out)  # no work, no folder, no partial files


def test_tiktoken_encoding_not_in_the_cache(monkeypatch, capsys, inputs):
    """cl100k_base is not in the offline cache: a dead proxy makes its download fail at once."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    assert run_inprocess(monkeypatch, TEXT, "--input", inputs / "ok.txt", "--tokenizer=cl100k_base",
                         "--out_dir", inputs / "out") == 2
    err = capsys.readouterr().err.strip()
    assert "cannot load the tiktoken encoding 'cl100k_base'" in err and "TIKTOKEN_CACHE_DIR" in err
    assert len(err.splitlines()) == 1 and not os.path.exists(inputs / "out")


@pytest.mark.parametrize("args,env,words", [
    ([SHAKESPEARE, "--url=http://127.0.0.1:9/input.txt"], {}, ["download of http://127.0.0.1:9/input.txt failed",
                                                                "--input PATH"]),
    ([OWT, "--dataset=nobody/no-such-dataset"], {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
     ["cannot load 'nobody/no-such-dataset'", "--input PATH"]),
])
def test_offline_without_input_says_how_to_pass_a_local_copy(tmp_path, args, env, words, request):
    if args[0] == OWT:  # it loads the GPT-2 vocabulary before it looks for data
        request.getfixturevalue("gpt2_vocab")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, *args, "--out_dir", str(out)], capture_output=True, text=True,
                       env={**os.environ, "HF_HOME": str(tmp_path / "hf"), **env})
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words) and last.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(out)


# ---------------------------------------------------------------- meta.json drives training and sampling

@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core machine run several times faster on one thread than on two."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_train_and_sample_on_gpt2_tokens(gpt2_root, tmp_path, capsys, one_torch_thread):
    import sample
    import train
    out = tmp_path / "run"
    # small batches and evaluations: a 50257-way softmax is most of the cost on a CPU
    train.main(train_args(gpt2_root, out, "--dataset=shakespeare", "--max_iters=10", "--eval_interval=10",
                          "--eval_iters=2", "--batch_size=4", "--attention=gqa", "--n_kv_head=2"))
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert log[0]["val_loss"] > 10 and log[-1]["val_loss"] < log[0]["val_loss"] - 1.0  # ln(50257) = 10.8
    capsys.readouterr()
    sample.main([f"--out_dir={out}", "--start=ROMEO:", "--max_new_tokens=30", "--temperature=0"])
    sampled = capsys.readouterr().out
    assert sampled.startswith("ROMEO:") and len(sampled.split("---------------")[0]) > len("ROMEO:") + 30


def test_load_tokenizer_follows_meta(gpt2_vocab):
    from tokenizer import TokenizerError, load_tokenizer
    tok = load_tokenizer({"tokenizer": "tiktoken:gpt2", "vocab_size": 50257})
    s = "ROMEO: caf\u00e9\n<|endoftext|>"
    assert tok.decode(tok.encode(s)) == s and tok.encode("<|endoftext|>") == [50256]
    assert load_tokenizer({"tokenizer": "char", "chars": ["a", "b"]}).encode("ba") == [1, 0]
    with pytest.raises(TokenizerError, match="upgrade tiktoken"):
        load_tokenizer({"tokenizer": "tiktoken:gpt9"})
    with pytest.raises(TokenizerError, match="no 'chars'"):
        load_tokenizer({"tokenizer": "char"})


def test_configs_take_the_vocabulary_from_meta(gpt2_root, tmp_path):
    """The repo's configs as written, with out_dir moved to tmp_path: a user's own out-gqa/ (the
    quickstart's run) must neither be read nor stop the test."""
    import train
    out = f"--out_dir={tmp_path / 'run'}"
    tc, model, meta, _, _ = train.load_settings([os.path.join(ROOT, "config/gqa.py"), "--dataset=shakespeare",
                                              f"--data_dir={gpt2_root}", out])
    assert model.vocab_size == 50257 and model.attention == "gqa" and meta["tokenizer"] == "tiktoken:gpt2"
    tc, model, _, _, _ = train.load_settings([os.path.join(ROOT, "config/shakespeare_gpt2.py"),
                                              f"--data_dir={gpt2_root}", out])
    assert tc.dataset == "shakespeare" and model.vocab_size == 50257
    for name in ("openwebtext", "fineweb"):  # stand-in data: meta.json and a little more than one window
        (tmp_path / name).mkdir()
        for f in ("train.bin", "val.bin"):
            (tmp_path / name / f).write_bytes(bytes(2 * 1100))
        (tmp_path / name / "meta.json").write_text(json.dumps({"vocab_size": 50257, "dtype": "uint16",
                                                               "tokenizer": "tiktoken:gpt2"}))
    tc, model, _, _, _ = train.load_settings([os.path.join(ROOT, "config/owt_gpt2_124m.py"),
                                              f"--data_dir={tmp_path}", out])
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size) == (12, 12, 768, 1024)
    assert (tc.batch_size, tc.gradient_accumulation_steps, tc.learning_rate, tc.max_iters, tc.weight_decay) == \
        (12, 40, 6e-4, 600000, 0.1)
    tc, model, _, _, _ = train.load_settings([os.path.join(ROOT, "config/fineweb_gpt2.py"),
                                              f"--data_dir={tmp_path}", out])
    assert tc.dataset == "fineweb" and model.n_embd == 768


def test_train_reads_the_dtype_from_meta(monkeypatch, tmp_path, text, one_torch_thread):
    """The same characters stored as uint16 and as uint32 train to the same losses."""
    import train
    small = tmp_path / "small.txt"
    small.write_text(text[:60_000])
    for dtype in ("uint16", "uint32"):
        assert run_inprocess(monkeypatch, TEXT, "--input", small, "--out_dir", tmp_path / f"d{dtype}",
                             "--tokenizer=char", f"--dtype={dtype}", "--num_proc=1") == 0
        train.main(train_args(tmp_path, tmp_path / f"run{dtype}", f"--dataset=d{dtype}", "--max_iters=4",
                              "--eval_interval=4", "--eval_iters=2"))
    logs = [[json.loads(line) for line in open(tmp_path / f"run{d}" / "log.jsonl")] for d in ("uint16", "uint32")]
    assert [r["val_loss"] for r in logs[0]] == [r["val_loss"] for r in logs[1]]


def test_one_giant_line_is_cut_with_bounded_memory(tmp_path, monkeypatch, capsys):
    """No newline and no space between words: the reader still hands out bounded pieces (it read
    the whole line into one piece before), says so once, and loses no character."""
    monkeypatch.setattr(tokenizers, "CHUNK_CHARS", 1000)
    monkeypatch.setattr(text_source, "MAX_CARRY", 4000)
    text = "abcdefghij" * 5000                         # 50,000 characters, one "word"
    path = tmp_path / "line.txt"
    path.write_text(text)
    pieces = [p for *_, p in text_source.text_pieces([str(path)], split_at=len(text))]
    assert "".join(pieces) == text and max(map(len, pieces)) <= 4000 + 1000
    assert capsys.readouterr().err.count("note:") == 1


@pytest.mark.parametrize("newlines", ["keep", "unix"])
def test_byte_order_mark_and_crlf_are_reported_and_converted_on_request(monkeypatch, capsys, tmp_path, newlines):
    """keep (the default) tokenizes the exact text and says that it holds a BOM and \\r; unix reads it
    as dos2unix would leave it (\\r\\n -> \\n, the leading BOM dropped), with no other tool."""
    raw = "\ufeffFirst Citizen:\r\nBefore we proceed\r\nany further, hear me speak.\r\n" * 40
    (tmp_path / "dos.txt").write_bytes(raw.encode("utf-8"))
    out = tmp_path / "out"
    assert run_inprocess(monkeypatch, TEXT, "--input", tmp_path / "dos.txt", "--tokenizer=char", "--out_dir", out,
                         "--num_proc=1", f"--newlines={newlines}") == 0
    train, val, meta = read_bins(out)
    text = "".join(meta["chars"][i] for i in np.concatenate([train, val]))
    err = capsys.readouterr().err
    if newlines == "keep":
        assert text == raw and "\r" in meta["chars"] and "newlines" not in meta
        assert "start with a UTF-8 byte-order mark" in err and "hold \\r (CRLF line ends)" in err
        assert "--newlines=unix" in err
    else:
        assert text == raw[1:].replace("\r\n", "\n") and "\r" not in meta["chars"] and meta["newlines"] == "unix"
        assert "note:" not in err
