"""Fixtures: the downloads the tests need and a prepared Tiny Shakespeare (character level).

Tiny Shakespeare comes from $TINYSHAKESPEARE_INPUT and tiktoken's GPT-2 vocabulary from
$TIKTOKEN_CACHE_DIR when they are set (CI points them at local copies); without them both are
downloaded, and offline every test that needs one skips with a line naming its variable.
The suite also fails if it changed the checkout (tests/checkout_guard.py).
"""
import os
import runpy
import subprocess
import sys

import pytest
import torch

# Triton reads this at import: without a GPU, kernels run under its interpreter on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist (-n N) each worker takes one core: tiny models run faster on one thread.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
# train.py's automatic thread count follows the machine's load (trainer/threads.py); with
# OMP_NUM_THREADS set it keeps torch's, so the runs a test compares (a resumed run and its
# uninterrupted twin) reduce in the same order, here and in the subprocesses tests start.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))

from checkout_guard import pytest_sessionfinish, pytest_sessionstart  # noqa: E402, F401  (hooks)
from helpers import ROOT  # noqa: E402

SHAKESPEARE_CHAR = os.path.join(ROOT, "data/shakespeare_char/prepare.py")


@pytest.fixture(scope="session")
def shakespeare_input(tmp_path_factory):
    """The path of Tiny Shakespeare's input.txt: $TINYSHAKESPEARE_INPUT, else downloaded once into
    the session's tmp folder (never the checkout's data/); offline without the variable, a skip."""
    if os.environ.get("TINYSHAKESPEARE_INPUT"):
        return os.environ["TINYSHAKESPEARE_INPUT"]
    from data import errors, text_source
    try:
        return text_source.download(runpy.run_path(SHAKESPEARE_CHAR)["URL"],
                                    str(tmp_path_factory.mktemp("download") / "input.txt"))
    except errors.InputError:
        pytest.skip("offline: needs Tiny Shakespeare; export TINYSHAKESPEARE_INPUT=/path/to/input.txt")


@pytest.fixture(scope="session")
def gpt2_vocab():
    """tiktoken's GPT-2 encoding (the project's tokenizer object); offline without a cache, a skip."""
    from tokenizer import TokenizerError, load_tokenizer
    try:
        return load_tokenizer({"tokenizer": "tiktoken:gpt2"})
    except TokenizerError:
        pytest.skip("offline: needs tiktoken's gpt2 encoding; export TIKTOKEN_CACHE_DIR=/path/to/tiktoken_cache")


@pytest.fixture(scope="session")
def data_root(tmp_path_factory, shakespeare_input):
    """A data_dir holding shakespeare_char/{train,val}.bin and meta.json."""
    root = tmp_path_factory.mktemp("data")
    r = subprocess.run([sys.executable, SHAKESPEARE_CHAR, "--input", shakespeare_input,
                        "--out_dir", str(root / "shakespeare_char")], capture_output=True, text=True)
    if r.returncode != 0:  # the script's own line, not a CalledProcessError, once per test that needs it
        pytest.fail(r.stderr.strip(), pytrace=False)
    return root

