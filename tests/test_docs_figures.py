"""Every figure the README and the docs quote comes from a file in the repository, and this test finds it there:
a figure copied by hand drifts from what the code gives, and a reader cannot tell.

The rule, per document in ``DOCS`` and per section (a level-2 heading down to the next one):

* a *figure* is a decimal number (``1.85``, ``0.005``, the ``1.3`` of ``1.3x``), a number with thousands separators
  (``124,475,904``) or a percentage (``5 %``, ``36.0%``), in the section's prose and tables;
* not a figure: fenced code blocks, inline code spans (commands, file names such as ``tuned_hparams__tpp0.15.yaml``),
  link targets, HTML comments, version numbers (``2.13.0``), dates, arXiv ids, and the figures of a sentence that
  carries its own citation (an arXiv id or a web address): published results are quoted with their source, and
  cannot be in this repository;
* each figure must occur, as a whole number (``1.85`` is not found in ``1.853``: a rounded or drifted copy fails),
  in one of the files the section links (relative markdown links): a generated results file for a measurement
  (``docs/results/``, ``benchmarks/results/``, ``benchmarks/RESULTS.md``), the module or recipe that defines it for
  a setting or a constant;
* a section that quotes a figure and links nothing fails, naming the section.

The README's study table (between :data:`STUDY_OPEN` and :data:`STUDY_CLOSE`) is checked against the committed CPU
study report alone; until that report is committed the block is skipped, with a reason naming the missing file.
The rule itself is tested on small texts below, so it stays tested whatever the documents say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", REPO / "docs" / "METHOD.md", REPO / "benchmarks" / "README.md")
STUDY_OPEN = "<!-- study-table: filled from docs/results/cpu_study/report.md -->"
STUDY_CLOSE = "<!-- /study-table -->"
STUDY_REPORT = REPO / "docs" / "results" / "cpu_study" / "report.md"
STUDY_SOURCES = (STUDY_REPORT, STUDY_REPORT.with_name("evidence.md"), STUDY_REPORT.with_name("summary.csv"))
# Characters, not lines: a line cap lets a document grow sideways. The caps sit a little above each document's size,
# so a document grows only by a decision to raise its cap; method, results and history belong elsewhere.
MAX_CHARS = {REPO / "README.md": 21_000, REPO / "docs" / "ARCHITECTURE.md": 24_500, REPO / "docs" / "METHOD.md": 29_000}

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
_CITATION = re.compile(r"arXiv:\s*\d{4}\.\d{4,5}|https?://\S+", re.I)
# A figure quoted from this repository's own history ("... 1.86 (this README at commit 9714d85)"): checked against
# that commit's version of the document, not against today's files.
_HISTORY = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")
# A figure: a decimal, a number with thousands separators, or an integer percentage, with any unit after it (1.3x,
# 1.2B). Not part of a longer number or a name (tpp0.15), not a version (2.13.0), not a date (no decimal point).
_FIGURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?=\s?%))(?!\d|[.,]\d)(\s?%)?")
_SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(*|\-])|\n\s*\n|\n(?=\s*[-*|] )")


@dataclass(frozen=True)
class Section:
    """One level-2 section of a document: its heading, its text, the files its links name."""

    doc: Path
    heading: str
    text: str

    def links(self) -> list[Path]:
        """The repository files the section links (relative links, anchors dropped), resolved from its document."""
        out = []
        for _, target in _LINK.findall(_FENCE.sub("", self.text)):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (self.doc.parent / target.split("#", 1)[0]).resolve()
            if path.is_file():
                out.append(path)
        return out


def sections(doc: Path, text: str) -> list[Section]:
    """``text`` cut at its level-2 headings (the part before the first one is the section "(top)")."""
    parts = re.split(r"^## ", text, flags=re.M)
    out = [Section(doc, "(top)", parts[0])]
    out += [Section(doc, p.split("\n", 1)[0].strip(), p) for p in parts[1:]]
    return out


def prose(text: str) -> str:
    """``text`` without what holds no quoted figure: code, comments, link targets (the link text stays)."""
    text = _FENCE.sub("", text)
    text = _COMMENT.sub("", text)
    text = _LINK.sub(lambda m: m.group(1), text)
    return _CODE.sub("", text)


def _sentence_figures(sentence: str) -> list[str]:
    """One sentence's figures as found in a source: thousands separators dropped, a percentage marked "%"."""
    return [number.replace(",", "") + ("%" if percent else "") for number, percent in _FIGURE.findall(sentence)]


def figures(text: str) -> list[str]:
    """The figures of ``text`` (see the module doc), in order; a sentence carrying a citation contributes none."""
    out = []
    for sentence in _SENTENCE_END.split(prose(text)):
        if _CITATION.search(sentence) or _HISTORY.search(sentence):
            continue
        out += _sentence_figures(sentence)
    return out


def history_figures(text: str) -> list[tuple[str, list[str]]]:
    """(commit, figures) for each sentence of ``text`` that quotes this repository's history by commit."""
    out = []
    for sentence in _SENTENCE_END.split(prose(text)):
        match = _HISTORY.search(sentence)
        if match and not _CITATION.search(sentence):
            figs = _sentence_figures(_HISTORY.sub("", sentence))
            if figs:  # a sentence naming a commit without quoting a figure ("runs at commit 9e5ae86") quotes nothing
                out.append((match.group(1), figs))
    return out


def found_in(figure: str, source: str) -> bool:
    """Whether ``figure`` occurs in ``source`` as a whole number (thousands separators ignored on both sides), a
    percentage as a percentage ("5%" is not found in "5 s")."""
    plain = re.sub(r"(?<=\d),(?=\d{3})", "", source)
    number, percent = figure.removesuffix("%"), figure.endswith("%")
    tail = r"\s?%" if percent else r"(?!\d|\.\d)"
    return re.search(rf"(?<![\d.]){re.escape(number)}{tail}", plain) is not None


def unsourced(section: Section, text: str | None = None, sources: list[Path] | None = None) -> list[str]:
    """The figures of ``section`` (or of ``text`` in it) that none of its linked files (or ``sources``) holds;
    ["(no link)"] when it quotes figures and links nothing."""
    figs = figures(section.text if text is None else text)
    files = section.links() if sources is None else sources
    if figs and not files:
        return ["(no link)"]
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return sorted({f for f in figs if not any(found_in(f, t) for t in texts)})


def without_study_block(text: str) -> str:
    """``text`` with the README's study-table block cut out (it is checked on its own)."""
    if STUDY_OPEN not in text:
        return text
    head, rest = text.split(STUDY_OPEN, 1)
    return head + rest.split(STUDY_CLOSE, 1)[1] if STUDY_CLOSE in rest else head


# -- the rule, on small texts -------------------------------------------------------------------------------------

def _doc(tmp_path: Path, body: str, results: str) -> Section:
    (tmp_path / "results.md").write_text(results, encoding="utf-8")
    doc = tmp_path / "DOC.md"
    doc.write_text(body, encoding="utf-8")
    return sections(doc, body)[1]


def test_a_figure_copied_from_its_source_passes(tmp_path: Path) -> None:
    section = _doc(tmp_path, "## Results\nMuon 1.85x [1.26, 2.72], 31 % MDE, 124,475,904 parameters "
                             "([report](results.md)).\n", "| muon | 1.85 [1.26, 2.72] | MDE 31% | 124475904 |\n")
    assert figures(section.text) == ["1.85", "1.26", "2.72", "31%", "124475904"]
    assert unsourced(section) == []


def test_a_drifted_or_rounded_copy_fails(tmp_path: Path) -> None:
    """A hand-copied figure that no longer matches its source is named: a drifted value, a rounded one, a
    percentage, a value found only inside a longer number."""
    section = _doc(tmp_path, "## Results\nMuon 1.89x, Lion 1.2x, 93.4 %, 0.5 nats, 40 % ([report](results.md)).\n",
                   "muon 1.853, lion 1.21, 93.45 %, 10.5 nats, 40 s\n")
    assert unsourced(section) == ["0.5", "1.2", "1.89", "40%", "93.4%"]


def test_figures_without_a_link_fail(tmp_path: Path) -> None:
    section = _doc(tmp_path, "## Results\nMuon is 1.85x faster.\n", "1.85\n")
    assert unsourced(section) == ["(no link)"]


def test_code_versions_dates_links_and_cited_figures_are_not_figures() -> None:
    text = ("Run `hf-optbench run recipes/x_tpp0.15.yaml` with torch 2.13.0 on 2026-11-26 "
            "([file](docs/a_0.5.md)).\n\n```bash\nmake demo  # 1.5 s\n```\n<!-- 7.5 -->\n"
            "Marin found 1.4x at 130M shrinking to 1.1x at 1.2B (arXiv:2509.02046). Ours is 2.5x.\n")
    assert figures(text) == ["2.5"]


def test_a_figure_from_the_repository_history_is_read_against_that_commit() -> None:
    text = "Muon 2.22 now. The previous protocol reported 1.86 / 1.90 (this README at commit 9714d85). Lion 1.2.\n"
    assert figures(text) == ["2.22", "1.2"]
    assert history_figures(text) == [("9714d85", ["1.86", "1.90"])]


def test_the_study_block_is_cut_out_for_the_section_check() -> None:
    text = f"a 1.5\n{STUDY_OPEN}\n| muon | 9.99 |\n{STUDY_CLOSE}\nb 2.5\n"
    assert figures(without_study_block(text)) == ["1.5", "2.5"]


# -- the README and the docs ----------------------------------------------------------------------------------------

def _doc_sections() -> list[Section]:
    return [s for d in DOCS for s in sections(d, d.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("section", _doc_sections(), ids=lambda s: f"{s.doc.name}:{s.heading[:40]}")
def test_every_quoted_figure_is_in_a_file_the_section_links(section: Section) -> None:
    missing = unsourced(section, without_study_block(section.text))
    assert not missing, (f"{section.doc.relative_to(REPO)}, section '{section.heading}': figures not found in the "
                         f"files it links ({[str(p.relative_to(REPO)) for p in section.links()]}): {missing}. Link "
                         "the generated file that holds them, or copy them from it as written.")


@pytest.mark.parametrize("doc", list(MAX_CHARS), ids=lambda d: d.name)
def test_the_readme_and_the_design_docs_stay_within_their_length(doc: Path) -> None:
    chars, cap = len(doc.read_text(encoding="utf-8")), MAX_CHARS[doc]
    assert chars <= cap, (f"{doc.relative_to(REPO)} has {chars} characters (at most {cap}): say each fact once, and "
                          "move method, results or history to docs/METHOD.md, benchmarks/README.md or docs/notes/")


def test_the_readme_study_table_is_the_committed_study_report() -> None:
    readme = DOCS[0].read_text(encoding="utf-8")
    assert STUDY_OPEN in readme and STUDY_CLOSE in readme, "README.md lost its study-table block markers"
    block = readme.split(STUDY_OPEN, 1)[1].split(STUDY_CLOSE, 1)[0]
    assert STUDY_REPORT.is_file(), (f"{STUDY_REPORT.relative_to(REPO)} is missing: the README's study table quotes "
                                    "the committed report (hf-optbench report runs/cpu_study, copied to docs/results/)")
    section = Section(DOCS[0], "study table", block)
    figs = figures(block)
    assert figs, "the study-table block quotes no figure from the study report"
    missing = unsourced(section, block, [p for p in STUDY_SOURCES if p.is_file()])
    assert not missing, f"README study table: figures not in {STUDY_REPORT.relative_to(REPO)}: {missing}"


def test_figures_quoted_from_the_repository_history_are_in_that_commit() -> None:
    """A figure the README quotes from an earlier version of itself is read from that commit's README with git: a
    mistyped or invented "old" figure fails."""
    import subprocess

    quoted = [(doc, sha, figs) for doc in DOCS for sha, figs in history_figures(doc.read_text(encoding="utf-8"))]
    if not quoted:
        pytest.skip("no document quotes a figure from the repository's history")
    for doc, sha, figs in quoted:
        rel = doc.relative_to(REPO).as_posix()
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{sha}:{rel}"], capture_output=True, text=True)
        if shown.returncode != 0:
            pytest.skip(f"commit {sha} is not in this checkout's history (a shallow clone?): {shown.stderr.strip()}")
        missing = [f for f in figs if not found_in(f, shown.stdout)]
        assert figs and not missing, f"{rel}: figures quoted from commit {sha} not in its {rel}: {missing or figs}"
