"""Fixtures: a prepared Tiny Shakespeare (character level).

The corpus comes from $TINYSHAKESPEARE_INPUT (CI points it at a local copy); without it
the prepare script downloads the text.
"""
import os
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

from helpers import ROOT  # noqa: E402


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """A data_dir holding shakespeare_char/{train,val}.bin and meta.json."""
    root = tmp_path_factory.mktemp("data")
    cmd = [sys.executable, os.path.join(ROOT, "data/shakespeare_char/prepare.py"),
           "--out_dir", str(root / "shakespeare_char")]
    if os.environ.get("TINYSHAKESPEARE_INPUT"):
        cmd += ["--input", os.environ["TINYSHAKESPEARE_INPUT"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:  # the script's own line, not a CalledProcessError, once per test that needs it
        pytest.fail(f"{r.stderr.strip()} (offline: export TINYSHAKESPEARE_INPUT=/path/to/input.txt)",
                    pytrace=False)
    return root

