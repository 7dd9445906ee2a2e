"""Import the data package from `python data/<name>/prepare.py`, where only data/<name>/ is on sys.path.

Each prepare script runs this file by its path (runpy.run_path) at import time; it registers the
package found next to it as `data` in sys.modules, after which `from data import prepare_text`
works as usual. Why this way:
- sys.path.insert of the repo root (the package needs the root; the old scripts inserted data/ to
  reach common.py) would put train.py, model.py and the rest ahead of installed packages for the
  whole run, and hides where the import comes from; the tests may do it, the scripts do not;
- `python -m data.text.prepare` needs the repo root as the current folder and changes the
  documented command; `pip install -e .` adds an install step this repo does not otherwise need.
The cost: the package is registered by hand, so a different module called `data` already imported
in the same process would be replaced (a plain prepare run imports none), and spawned tokenizing
workers find the package only because they re-run the prepare script, and so this file, before
they unpickle their work; that is why the scripts run it at top level, not under __main__.
"""
import importlib.util
import os
import sys


def load_package():
    """The `data` package, imported from this folder unless this very package is already imported."""
    init = os.path.join(os.path.dirname(os.path.realpath(__file__)), "__init__.py")
    package = sys.modules.get("data")
    if package is not None and os.path.realpath(getattr(package, "__file__", None) or "") == init:
        return package  # tests import it first and patch its modules: keep that one
    spec = importlib.util.spec_from_file_location("data", init)
    package = importlib.util.module_from_spec(spec)
    sys.modules["data"] = package
    spec.loader.exec_module(package)
    return package


load_package()
