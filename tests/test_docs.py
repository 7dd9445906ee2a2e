"""The docs read as findings: each doc opens with "What it shows" (5 to 10 bullets), none is over
DOC_MAX_LINES lines, all of them together stay under TOTAL_MAX_LINES, and every relative link in
README.md and docs/ reaches a file that exists and, with #anchor, a heading of that file (GitHub's
anchors: lowercase, punctuation dropped, spaces to hyphens, -1, -2 for repeats).
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_MAX_LINES = 300
TOTAL_MAX_LINES = 2000
FIRST_SECTION = "## What it shows"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def docs(root=ROOT):
    return sorted((root / "docs").glob("*.md"))


def prose_lines(text):
    """The lines outside fenced code blocks (a link or heading in a code block is not one)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchor(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            a = anchor(m.group(1))
            out.add(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    return out


def broken_links(root=ROOT):
    """['doc: target (why)'] for each relative link that does not resolve."""
    problems = []
    for doc in [root / "README.md", *docs(root)]:
        for line in prose_lines(doc.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):        # http:, https:, mailto:
                    continue
                path, _, frag = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                name = f"{doc.relative_to(root)}: {target}"
                if not dest.exists():
                    problems.append(f"{name} (no such file)")
                elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                    problems.append(f"{name} (no heading with that anchor)")
    return problems


def first_section(path):
    """(the first '## ' heading, the number of top-level bullets under it)."""
    lines = prose_lines(path.read_text(encoding="utf-8"))
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    if not heads:
        return None, 0
    end = next((i for i in heads[1:]), len(lines))
    return lines[heads[0]], sum(line.startswith("- ") for line in lines[heads[0] + 1:end])


@pytest.mark.parametrize("path", docs(), ids=lambda p: p.name)
def test_each_doc_opens_with_what_it_shows(path):
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("# "), f"{path.name}: line 1 must be its '# Title'"
    heading, bullets = first_section(path)
    assert heading == FIRST_SECTION, f"{path.name}: the first section is {heading!r}, not {FIRST_SECTION!r}"
    assert 5 <= bullets <= 10, f"{path.name}: 'What it shows' holds {bullets} bullets (5 to 10)"


def test_no_doc_is_long_and_all_of_them_are_short():
    lengths = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in docs()}
    assert {n: k for n, k in lengths.items() if k > DOC_MAX_LINES} == {}
    assert sum(lengths.values()) < TOTAL_MAX_LINES, lengths


def test_every_relative_link_resolves():
    assert broken_links() == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## What it shows\n\n## The `x_y` study: 5 seeds, L = 64\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#the-x_y-study-5-seeds-l--64) [self](#readme) [web](https://x.org/#nope)\n"
        "[gone](docs/b.md) [bad](docs/a.md#the-study)\n\n# README\n```\n[in code](docs/c.md)\n```\n")
    assert broken_links(tmp_path) == ["README.md: docs/b.md (no such file)",
                                      "README.md: docs/a.md#the-study (no heading with that anchor)"]


def test_the_structure_check_names_a_doc_without_its_first_section(tmp_path):
    path = tmp_path / "b.md"
    path.write_text("# B\n\n## Results\n- one\n")
    assert first_section(path) == ("## Results", 1)
    path.write_text("# B\n\n## What it shows\n" + "- a finding\n" * 6 + "```\n- not a bullet\n```\n## Next\n- x\n")
    assert first_section(path) == (FIRST_SECTION, 6)
