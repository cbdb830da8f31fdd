"""Charters (articles of clauses with ids like ``[10.1]``) and the judge's prompt templates.

Both live in the top-level ``charter/`` folder, next to ``align/`` and ``rewards/``: the
default charter (``default.md``), example charters of users' own (``example_de.md``), and
the prompt templates of the judge, the controversy classifier and the degrader (``*.txt``).
A wheel installs the folder next to the packages (``site-packages/charter``), so a
non-editable install finds it the same way as a source checkout: ``charter_dir()``.

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
line, a clause whose text itself holds a clause tag like ``[2.1]``) with an error naming
the file and line, because the judge quotes clause ids: each id must be unique, numbered
within its article, and appear exactly once in the rendered charter, so that a quoted id
points at one clause.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

from align.errors import ConfigError, InputError, MissingInputError
from align.io.files import read_text

DEFAULT_CHARTER = "default.md"

_TITLE = re.compile(r"^#\s+(?P<title>\S.*)$")
_ARTICLE = re.compile(r"^##\s+(?P<num>\d+)\.\s*(?P<title>.*)$")
_CLAUSE = re.compile(r"^\[(?P<article>\d+)\.(?P<clause>\d+)\]\s*(?P<text>.*)$")
_TAG = re.compile(r"\[\d+\.\d+\]")


def charter_dir() -> Path:
    """The ``charter/`` folder: next to the ``rewards`` package, in a checkout and in an install."""
    return Path(__file__).resolve().parent.parent / "charter"


class CharterError(InputError):
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
                if tag := _TAG.search(text):
                    raise self.error(line, f"clause [{number}.{clause_number}] contains the clause tag {tag.group(0)}; "
                                     "write 'clause 2.1' instead, so every tag in the charter marks one clause")
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


def bundled_charters() -> list[str]:
    """The names of the charters shipped in ``charter/``."""
    return sorted(p.name for p in charter_dir().glob("*.md"))


def find_charter(name_or_path: str | Path | None = None) -> Path:
    """The charter file meant by a path, or by a name in ``charter/`` (``default``,
    ``example_de.md``, ``charter/example_de.md``); None is the default charter.

    An existing file is that file. A value that looks like a path (a directory part other
    than ``charter/``, absolute, or starting with ``~``) and is not a file is an error
    naming it, never a bundled charter of the same name: a typo in a charter path must not
    judge with another charter. Anything else must be a bundled name.
    """
    if name_or_path is None:
        return charter_dir() / DEFAULT_CHARTER
    text = str(name_or_path)
    if not text.strip():
        raise ConfigError("charter: an empty name (leave it unset for the default charter)")
    path = Path(text).expanduser()
    if path.is_file():
        return path
    parts = Path(text).parts
    bundled_form = len(parts) == 1 or (len(parts) == 2 and parts[0] == "charter")
    if not bundled_form or text.startswith(("~", "/", ".")):
        raise MissingInputError(f"no charter {text!r}: file not found")
    name = Path(parts[-1])
    for candidate in (name, name.with_suffix(".md")):
        bundled = charter_dir() / candidate.name
        if bundled.is_file():
            return bundled
    raise MissingInputError(f"no charter {text!r}: not a file, and not one of the bundled charters "
                            f"{bundled_charters()} in {charter_dir()}")


def charter_fingerprint(name_or_path: str | Path | Charter | None = None) -> str:
    """sha256 (hex) of the charter text the judge prompts start with (``Charter.text()``):
    what a judge's scores depend on, resolved as `find_charter` resolves a name or path."""
    charter = name_or_path if isinstance(name_or_path, Charter) else load_charter(name_or_path)
    return hashlib.sha256(charter.text().encode("utf-8")).hexdigest()


def load_charter(path: str | Path | None = None) -> Charter:
    """Load and validate a charter file (a path, or a name in ``charter/``); None loads the
    project's default charter."""
    file = find_charter(path)
    source = f"charter/{file.name}" if file.parent == charter_dir() else str(path)
    return parse_charter(read_text(file, what="charter"), source)  # UTF-8, else an error naming the byte


def load_template(name_or_path: str | Path) -> Template:
    """A prompt template: a name in ``charter/`` (`judge_pointwise`) or a file path.

    Templates use `$name` placeholders (string.Template), so braces in JSON examples and
    in user text need no escaping.
    """
    candidate = Path(name_or_path)
    if candidate.suffix and candidate.exists():
        return Template(read_text(candidate, what="prompt template").strip())
    resource = charter_dir() / f"{name_or_path}.txt"
    if not resource.is_file():
        raise MissingInputError(f"no prompt template {name_or_path!r} (neither a file nor a template in {charter_dir()})")
    return Template(resource.read_text(encoding="utf-8").strip())


def template_fields(template: Template) -> set[str]:
    """The placeholder names a template uses (to check a user's template fits its role)."""
    return set(template.get_identifiers())
