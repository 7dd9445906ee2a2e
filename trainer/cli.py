"""The command line every script shares: nanoGPT-style configuration (python train.py config/x.py
--key=value ...) and the one-line errors (fail, OneLineParser, check_output).

A config file is Python that assigns keys as globals (and may `include("base.py")`, a
path relative to the including file). It runs as Python, with your permissions, before
anything else is checked: never load a config file from a source you do not trust.
`--key=value` overrides come after; values are parsed as Python literals and checked
against the key's declared type. Any problem is raised as ConfigError with a one-line
message; the scripts print it and exit 2.
"""
import argparse
import ast
import difflib
import os
import sys
import tempfile


class ConfigError(ValueError):
    pass


def fail(msg):
    """A user mistake: one line on stderr and exit status 2 (used by every script)."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def check_output(path, flag, folder=False):
    """Before any work: an output file's folder exists and is writable (folder=True: the output is
    a folder, made if missing, so its nearest existing ancestor must be writable). One line, exit 2."""
    if path is None:
        return
    target = os.path.abspath(path)
    if folder and os.path.exists(target) and not os.path.isdir(target):
        fail(f"{flag}={path} is a file, not a folder; pick a folder for the outputs")
    if not folder and os.path.isdir(target):
        fail(f"{flag}={path} is a folder; give a file name, e.g. {os.path.join(path, 'out.json')}")
    parent = target if folder else os.path.dirname(target)
    while folder and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        fail(f"{flag}={path}: the folder {os.path.dirname(target)} does not exist; create it or pick another path")
    if not os.access(parent, os.W_OK):
        fail(f"{flag}={path}: {parent} is not writable; pick another path")
    try:  # access() says yes to root everywhere, /proc and read-only mounts too: make (and remove) a probe
        os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=parent))
    except OSError as e:
        fail(f"{flag}={path}: cannot write in {parent} ({e.strerror}); pick another path")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit status 2 (argparse prints the usage first)."""

    def error(self, message):
        fail(f"{message}; see {self.prog} --help")


def positive_float(text):
    """argparse type: a finite number > 0 (argparse names the flag in its one-line error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def _check_type(key, value, typ, raw):
    if typ is str:
        value = raw if isinstance(raw, str) and not isinstance(value, str) else value
        if not isinstance(value, str):  # e.g. out_dir = 5 in a config file
            raise ConfigError(f"{key}={raw!r} has the wrong type: expected str, got {type(value).__name__}")
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}={raw!r} has the wrong type: expected {typ.__name__}, got {type(value).__name__}")


def _exec_config_file(path, namespace):
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        names = sorted(n for n in os.listdir(folder) if n.endswith(".py")) if os.path.isdir(folder) else []
        close = difflib.get_close_matches(os.path.basename(path), names, n=1)
        hint = f"; did you mean {os.path.join(os.path.dirname(path), close[0])}?" if close else ""
        raise ConfigError(f"config file {path!r} not found{hint}")
    base = os.path.dirname(os.path.abspath(path))

    def include(rel):  # relative to this file, also after an include of a file elsewhere has run
        _exec_config_file(os.path.join(base, rel), namespace)
        namespace["include"] = include
    namespace["include"] = include
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at {e.start}); "
                          "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path} ({e.strerror})") from None
    try:
        code = compile(source, path, "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes
        raise ConfigError(f"{path}, line {getattr(e, 'lineno', '?')}: cannot compile it: {getattr(e, 'msg', e)}") \
            from None
    try:
        exec(code, namespace)  # config files are Python: they run as the user who runs the command
    except SystemExit as e:
        raise ConfigError(f"{path} called sys.exit({e.code!r}); a config file only assigns keys") from None
    except KeyboardInterrupt:
        raise ConfigError(f"{path} raised KeyboardInterrupt while it ran; nothing was started") from None
    except Exception as e:  # a user's config file: report it in one line
        raise ConfigError(f"{path}: {type(e).__name__}: {e}") from None


def _unknown(key, types, where):
    close = difflib.get_close_matches(key, types, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "python train.py --help lists them"
    return ConfigError(f"unknown key {key!r} in {where}; {hint}")


def parse_config(argv, types: dict, defaults: dict, explicit: set | None = None) -> dict:
    """argv: config files then --key=value; types/defaults: key -> type / default value.
    explicit, when given, receives the keys that a config file or an override set."""
    config = dict(defaults)
    explicit = set() if explicit is None else explicit
    for arg in argv:
        if not arg.startswith("--"):
            namespace = {}
            _exec_config_file(arg, namespace)
            for key, value in namespace.items():
                if key.startswith("_") or key == "include" or callable(value) or type(value).__name__ == "module":
                    continue
                if key not in types:
                    raise _unknown(key, types, arg)
                config[key] = _check_type(key, value, types[key], value)
                explicit.add(key)
            continue
        key, eq, raw = arg[2:].partition("=")
        if not eq:
            raise ConfigError(f"override {arg!r} must look like --key=value")
        if key not in types:
            raise _unknown(key, types, arg)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a bare word such as --dataset=shakespeare_char
        config[key] = _check_type(key, value, types[key], raw)
        explicit.add(key)
    return config
