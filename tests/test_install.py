"""A fresh install works from the checkout: nothing of the project shadows a package its own
stack imports (the Triton kernels' folder was once `kernels/`, the name of Hugging Face's
`kernels`, which transformers imports), and the suite's guard against tests that write into the
checkout (tests/checkout_guard.py) catches a test that does."""
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))


def project_import_names():
    """The names `import NAME` resolves to the checkout when it is the working folder (as for
    `python train.py`): the .py files and the folders with an __init__.py at its top. A folder
    without one (config/) is a namespace portion, which an installed package of that name wins
    over, so it cannot shadow one."""
    names = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    names |= {d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))}
    return names


def test_the_project_finds_its_own_names():
    assert {"attention", "attn_kernels", "data", "tools", "trainer", "model", "train", "tokenizer"} <= \
        project_import_names()


def test_no_project_name_is_an_installed_distributions_import_name():
    installed = importlib.metadata.packages_distributions()    # import name -> distributions
    clashes = {n: installed[n] for n in sorted(project_import_names()) if n in installed}
    assert not clashes, f"rename these: an installed distribution imports the same top-level name: {clashes}"


def test_transformers_imports_from_the_repo_root():
    """From the repo root, the project's packages and transformers' GPT-2 import side by side."""
    pytest.importorskip("transformers")
    code = ("import attention, attn_kernels.reference, data, model, tools, trainer; import transformers; "
            "from transformers import GPT2LMHeadModel")
    if importlib.util.find_spec("kernels") is not None:  # Hugging Face's kernels, where installed
        code += f"; import kernels; assert not kernels.__file__.startswith({ROOT!r}), kernels.__file__"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def guarded_run(repo, test_body, *extra):
    """pytest with the checkout guard on one test file inside the git work tree `repo`."""
    (repo / "test_one.py").write_text(textwrap.dedent(test_body))
    env = {**os.environ, "PYTHONPATH": HERE}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "checkout_guard", "-p", "no:cacheprovider",
                           *extra, "test_one.py"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "out-old").mkdir()
    (tmp_path / "out-old" / "ckpt.pt").write_bytes(b"a user's run")
    return tmp_path


@pytest.mark.parametrize("body,found", [
    ("def test_x():\n    open('made.txt', 'w').write('x')\n", "added made.txt"),
    ("import os\ndef test_x():\n    os.makedirs('out-new')\n", "added out-new/"),
    ("def test_x():\n    open('out-old/ckpt.pt', 'wb').write(b'overwritten!')\n", "changed out-old/ckpt.pt"),
    ("import os\ndef test_x():\n    os.remove('out-old/ckpt.pt')\n", "removed out-old/ckpt.pt"),
])
def test_the_guard_fails_a_suite_that_writes_into_the_checkout(repo, body, found):
    r = guarded_run(repo, body)
    assert r.returncode == 1 and found in r.stdout and "1 passed" in r.stdout, r.stdout + r.stderr


def test_the_guard_passes_a_suite_that_writes_into_tmp_path_also_under_xdist(repo):
    body = "def test_x(tmp_path):\n    (tmp_path / 'made.txt').write_text('x')\n"
    assert guarded_run(repo, body).returncode == 0
    r = guarded_run(repo, "def test_x():\n    open('made.txt', 'w').write('x')\n", "-n", "2")
    assert r.returncode == 1 and "added made.txt" in r.stdout, r.stdout + r.stderr
