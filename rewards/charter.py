"""Charters (articles of clauses with ids like ``[10.1]``) and the judge's prompt templates.

A charter file is markdown in this shape::

    # Optional title
    Optional preamble lines (free text, before the first article).

    ## 1. Response Quality
    [1.1] First clause of article 1.
    [1.2] Second clause; a long clause may continue on
          indented lines, which are joined to it with a space.

    ## 2. Knowledge and Reasoning Standards
    [2.1] ...

Articles are numbered 1, 2, 3, ... in order; the clauses of article N are numbered N.1,
N.2, ... in order. The loader rejects anything else (a gap, a duplicate id, a clause
filed under the wrong article, an empty clause, an article without clauses, a stray
line) with an error naming the file and line, because the judge quotes clause ids and a
mis-numbered charter would make those quotes point at the wrong text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

DEFAULT_CHARTER = "default.md"

_TITLE = re.compile(r"^#\s+(?P<title>\S.*)$")
_ARTICLE = re.compile(r"^##\s+(?P<num>\d+)\.\s*(?P<title>.*)$")
_CLAUSE = re.compile(r"^\[(?P<article>\d+)\.(?P<clause>\d+)\]\s*(?P<text>.*)$")


class CharterError(ValueError):
    """A charter file that does not have the required shape; names the file and line."""

    def __init__(self, source: str, line: int, problem: str):
        self.source, self.line, self.problem = source, line, problem
        super().__init__(f"{source}:{line}: {problem}")


@dataclass(frozen=True)
class Clause:
    article: int
    number: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.article}.{self.number}"


@dataclass(frozen=True)
class Article:
    number: int
    title: str
    clauses: tuple[Clause, ...]


@dataclass(frozen=True)
class Charter:
    """A validated charter; `text()` is what the judge prompt starts with."""

    title: str
    preamble: str
    articles: tuple[Article, ...]
    source: str = "<string>"

    @property
    def clauses(self) -> list[Clause]:
        return [clause for article in self.articles for clause in article.clauses]

    def clause(self, clause_id: str) -> Clause:
        """Look a clause up by id ("10.1" or "[10.1]")."""
        wanted = clause_id.strip("[]")
        for clause in self.clauses:
            if clause.id == wanted:
                return clause
        raise KeyError(f"{self.source}: no clause [{wanted}]")

    def text(self) -> str:
        """Render the charter for a prompt: title, preamble, then `N. Title` and `[N.M] text`."""
        parts = [p for p in (self.title, self.preamble) if p]
        for article in self.articles:
            lines = [f"{article.number}. {article.title}"]
            lines += [f"[{c.id}] {c.text}" for c in article.clauses]
            parts.append("\n".join(lines))
        return "\n\n".join(parts)


class _Builder:
    """Accumulates articles and clauses line by line, checking numbering as it goes."""

    def __init__(self, source: str):
        self.source = source
        self.title = ""
        self.preamble: list[str] = []
        self.articles: list[tuple[int, str, int, list[list]]] = []  # num, title, line, clauses

    def error(self, line: int, problem: str) -> CharterError:
        return CharterError(self.source, line, problem)

    def add_title(self, line: int, title: str) -> None:
        if self.title or self.articles:
            raise self.error(line, "a '# title' line may appear once, before the first article")
        self.title = title.strip()

    def add_article(self, line: int, number: int, title: str) -> None:
        expected = len(self.articles) + 1
        if number != expected:
            raise self.error(line, f"article {number} found where article {expected} was expected")
        if not title.strip():
            raise self.error(line, f"article {number} has no title")
        self._close_article(line)
        self.articles.append((number, title.strip(), line, []))

    def add_clause(self, line: int, article: int, number: int, text: str) -> None:
        if not self.articles:
            raise self.error(line, f"clause [{article}.{number}] comes before any '## N. Title' article")
        current, _, _, clauses = self.articles[-1]
        if article != current:
            raise self.error(line, f"clause [{article}.{number}] is filed under article {current}")
        expected = len(clauses) + 1
        if number != expected:
            kind = "duplicate clause id" if number < expected else "clause numbering skips"
            raise self.error(line, f"{kind}: [{article}.{number}] where [{article}.{expected}] was expected")
        clauses.append([line, number, text.strip()])

    def continue_clause(self, line: int, text: str) -> None:
        if not self.articles or not self.articles[-1][3]:
            raise self.error(line, "indented continuation line without a clause before it")
        clause = self.articles[-1][3][-1]
        clause[2] = f"{clause[2]} {text.strip()}".strip()

    def _close_article(self, line: int) -> None:
        if self.articles and not self.articles[-1][3]:
            number, _, start, _ = self.articles[-1]
            raise self.error(start, f"article {number} has no clauses")

    def build(self, last_line: int) -> Charter:
        if not self.articles:
            raise self.error(last_line, "no articles found (expected '## 1. Title' lines)")
        self._close_article(last_line)
        articles = []
        for number, title, _, clauses in self.articles:
            for line, clause_number, text in clauses:
                if not text:
                    raise self.error(line, f"clause [{number}.{clause_number}] is empty")
            built = tuple(Clause(number, n, text) for _, n, text in clauses)
            articles.append(Article(number, title, built))
        return Charter(self.title, " ".join(self.preamble), tuple(articles), self.source)


def parse_charter(text: str, source: str = "<string>") -> Charter:
    """Parse and validate charter text; raises `CharterError` naming the bad line."""
    builder = _Builder(source)
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if m := _ARTICLE.match(raw):
            builder.add_article(number, int(m["num"]), m["title"])
        elif m := _TITLE.match(raw):
            builder.add_title(number, m["title"])
        elif m := _CLAUSE.match(raw):
            builder.add_clause(number, int(m["article"]), int(m["clause"]), m["text"])
        elif raw[0] in " \t" and builder.articles:
            builder.continue_clause(number, raw)
        elif not builder.articles:
            builder.preamble.append(raw.strip())
        else:
            raise builder.error(
                number, f"expected '## N. Title', '[N.M] clause text' or an indented continuation, got {raw.strip()[:60]!r}"
            )
    return builder.build(len(lines))


def load_charter(path: str | Path | None = None) -> Charter:
    """Load a charter file; None loads the project's default charter (package data)."""
    if path is None:
        resource = resources.files("rewards").joinpath(f"charters/{DEFAULT_CHARTER}")
        return parse_charter(resource.read_text(encoding="utf-8"), f"rewards/charters/{DEFAULT_CHARTER}")
    path = Path(path)
    return parse_charter(path.read_text(encoding="utf-8"), str(path))


def load_template(name_or_path: str | Path) -> Template:
    """A prompt template: a packaged name (`judge_pointwise`) or a file path.

    Templates use `$name` placeholders (string.Template), so braces in JSON examples and
    in user text need no escaping.
    """
    candidate = Path(name_or_path)
    if candidate.suffix and candidate.exists():
        return Template(candidate.read_text(encoding="utf-8").strip())
    resource = resources.files("rewards").joinpath(f"templates/{name_or_path}.txt")
    if not resource.is_file():
        raise FileNotFoundError(f"no prompt template {name_or_path!r} (neither a file nor a packaged template)")
    return Template(resource.read_text(encoding="utf-8").strip())


def template_fields(template: Template) -> set[str]:
    """The placeholder names a template uses (to check a user's template fits its role)."""
    return set(template.get_identifiers())
