"""A pytest plugin: the suite fails if it changed the checkout it runs from.

Tests write into tmp_path; the checkout holds the user's own run folders, prepared data and
reports (out-gqa/, data/*/train.bin, eval.png), which a test must never read, write or delete.
At the start of the session the plugin records every file and folder of the git work tree
(tracked, untracked and ignored alike) with its size and modification time; at the end it
records them again and, if anything was added, removed or rewritten, prints the paths and sets
a failing exit status. Python's own byte-code caches are left out. Under pytest-xdist only
the controlling process checks, after every worker has finished. Outside a git work tree (an
unpacked archive) it does nothing.
"""
import os
import subprocess

import pytest

SKIPPED = {"__pycache__", ".pytest_cache"}


def git(args, cwd):
    """git's stdout, or None where git or a work tree is missing."""
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def snapshot(start):
    """{path: (size, mtime_ns)} for every file and folder (size None) of the work tree holding
    `start`, .git and byte-code caches left out; None outside a git work tree. A walk rather than
    `git status` alone: git lists no empty folder, and an out_dir a test creates may stay empty."""
    top = git(["rev-parse", "--show-toplevel"], start)
    if not top:
        return None
    root = top.strip()
    state = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED and not (folder == root and d == ".git")]
        rel = os.path.relpath(folder, root)
        for d in dirs:
            state[os.path.normpath(os.path.join(rel, d)) + "/"] = None
        for f in files:
            try:
                st = os.lstat(os.path.join(folder, f))
            except OSError:  # removed while we walked
                continue
            state[os.path.normpath(os.path.join(rel, f))] = (st.st_size, st.st_mtime_ns)
    return state


def changes(before, after):
    """The paths added, removed or rewritten between two snapshots, as 'added PATH' lines."""
    lines = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines


def is_controller(config):
    return not hasattr(config, "workerinput")  # xdist gives each worker a workerinput


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    if is_controller(session.config):
        session.config._checkout_before = snapshot(str(session.config.rootpath))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_checkout_before", None)
    if before is None:
        return
    after = snapshot(str(session.config.rootpath))
    found = changes(before, after) if after is not None else []
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "the tests changed the checkout (a test must write into tmp_path):\n  " + "\n  ".join(found[:50])
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
