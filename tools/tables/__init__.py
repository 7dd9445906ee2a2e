"""Every table of numbers in README.md and docs/*.md, written by one command from stored results and
from the code.

    python -m tools.tables            # rewrite every generated table in place
    python -m tools.tables --check    # exit 1, naming each document and table that differs

A generated table stands between two marker lines of a document:

    <!-- table: fair256-paired-test -->
    | config | pairs | mean Δ | ...
    <!-- /table -->

NAME is a function of GENERATORS (tools/tables/*.py, each module's TABLES), which builds the table
from the small result files a study commits under docs/results/<study>/ (run summaries and evaluation
JSON, read through trainer.rundir.Run; for studies whose runs were not kept, table.json: the numbers
as the docs stated them and where they came from) and from the code itself (parameters, cache and
state bytes, FLOPs, on the meta device). Cache bytes are bf16 and a constant state fp32 everywhere.
A new study lands its result files, a generator and the markers in the same commit.

--check also fails on a table of numbers outside markers and on a README.md over README_MAX_LINES
lines. --root DIR reads and writes the documents and results under DIR (default: this checkout).
Exit status: 0 every table matches (or was written), 1 --check found a difference, 2 a marker or
table name is wrong (one line).
"""
import os
import re
import sys

from tools.tables import answer, cost, extension, ladder, lengths, loss, mqar, speed, stored, zoology
from tools.tables.source import HERE
from trainer.cli import OneLineParser, fail

GENERATORS = {**answer.TABLES, **loss.TABLES, **ladder.TABLES, **lengths.TABLES, **cost.TABLES, **mqar.TABLES,
              **speed.TABLES, **stored.TABLES, **extension.TABLES, **zoology.TABLES}
BEGIN = re.compile(r"^<!-- table: (\S+) -->$")
END = "<!-- /table -->"
README_MAX_LINES = 300
NUMBER = re.compile(r"[-+−]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?%?( ± .+| \[.+\])?")


class TableError(ValueError):
    """A marker or a table name that cannot be rendered."""


def documents(root):
    """README.md and docs/*.md, relative to root."""
    docs = sorted(n for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
    return ["README.md"] + [f"docs/{n}" for n in docs]


def spans(lines, doc):
    """[(name, begin, end)]: the marker lines of each generated table (lines[begin + 1:end] is the table)."""
    out, open_ = [], None
    for i, line in enumerate(lines):
        m = BEGIN.match(line)
        if m or line == END:
            if (m is None) == (open_ is None):
                what = f"table {m.group(1)} opens inside table {open_[0]}" if m else f"{END} closes no table"
                raise TableError(f"{doc}:{i + 1}: {what}")
            if m:
                open_ = (m.group(1), i)
            else:
                out.append((*open_, i))
                open_ = None
    if open_:
        raise TableError(f"{doc}:{open_[1] + 1}: table {open_[0]} has no {END} line")
    return out


def render(name, root, doc):
    if name not in GENERATORS:
        raise TableError(f"{doc}: no generator for table {name!r}; the names: {', '.join(sorted(GENERATORS))}")
    try:
        return GENERATORS[name](root)
    except (FileNotFoundError, KeyError) as e:  # a study's files not (yet) under docs/results/
        raise TableError(f"{doc}: table {name} cannot be built: its results are missing ({e}); store them with "
                         "python -m tools.tables.store") from None


def regenerate(lines, doc, root):
    """(lines with each marked table rebuilt, [(name, line number) of the tables that changed])."""
    out, changed, at = [], [], 0
    for name, begin, end in spans(lines, doc):
        table = render(name, root, doc)
        if lines[begin + 1:end] != table:
            changed.append((name, begin + 1))
        out += lines[at:begin + 1] + table
        at = end
    return out + lines[at:], changed


def unmarked_tables(lines, doc):
    """Line numbers of markdown tables outside markers that hold a number (a cell that is one)."""
    inside = {i for _, begin, end in spans(lines, doc) for i in range(begin, end + 1)}
    found, i = [], 0
    while i < len(lines):
        if i in inside or not lines[i].startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        cells = [c.strip() for row in lines[start + 2:i] for c in row.strip().strip("|").split("|")]
        if any(NUMBER.fullmatch(c.strip("*")) for c in cells):
            found.append(start + 1)
    return found


def read_lines(root, doc):
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        return f.read().split("\n")


def check(root):
    """One line per problem: a table that differs from its regeneration, an unmarked table of numbers,
    a README.md that is too long. Empty when every document is as the command writes it."""
    problems = []
    for doc in documents(root):
        lines = read_lines(root, doc)
        _, changed = regenerate(lines, doc, root)
        problems += [f"{doc}:{at}: table {name} differs from its regeneration (python -m tools.tables writes it)"
                     for name, at in changed]
        problems += [f"{doc}:{at}: a table of numbers outside <!-- table: NAME --> markers (give it a generator in "
                     "tools/tables)" for at in unmarked_tables(lines, doc)]
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = len(f.read().splitlines())
    if readme > README_MAX_LINES:
        problems.append(f"README.md: {readme} lines, more than {README_MAX_LINES} (results live in docs/)")
    return problems


def write(root):
    """Rewrite the generated tables of every document; [(doc, [names])] of those that changed."""
    done = []
    for doc in documents(root):
        lines = read_lines(root, doc)
        new, changed = regenerate(lines, doc, root)
        if changed:
            with open(os.path.join(root, doc), "w", encoding="utf-8") as f:
                f.write("\n".join(new))
            done.append((doc, [name for name, _ in changed]))
    return done


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.tables", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each table that differs")
    ap.add_argument("--root", default=HERE, help="the folder holding README.md and docs/ (default: this checkout)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.check:
            problems = check(args.root)
            for line in problems:
                print(line, file=sys.stderr)
            sys.exit(1 if problems else 0)
        for doc, names in write(args.root):
            print(f"rewrote {doc}: {', '.join(names)}", file=sys.stderr)
    except TableError as e:
        fail(str(e))
