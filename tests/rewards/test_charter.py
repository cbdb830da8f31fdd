"""The charter format, its loader's errors, the default charter and the prompt templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewards.charter import (
    CharterError,
    load_charter,
    load_template,
    parse_charter,
    template_fields,
)

TITLES = [
    "Response Quality",
    "Knowledge and Reasoning Standards",
    "Respectful Communication",
    "Preventing Harm",
    "Resolving Value Conflicts",
    "Professional Competence Boundaries",
    "Collective Decision-Making",
    "Autonomy and Personal Boundaries",
    "Long-term Orientation and Sustainability",
    "Human Agency",
    "AI Identity and Limits",
]


def test_default_charter_has_the_report_shape():
    charter = load_charter()
    assert [a.title for a in charter.articles] == TITLES
    assert [len(a.clauses) for a in charter.articles] == [6, 8, 9, 7, 8, 5, 8, 3, 5, 3, 6]
    assert len(charter.clauses) == 68
    assert [c.id for c in charter.articles[9].clauses] == ["10.1", "10.2", "10.3"]
    assert charter.clause("[10.1]").text.startswith("Leave final decisions with people")


def test_default_charter_text_quotes_every_clause_id_once():
    text = load_charter().text()
    for clause in load_charter().clauses:
        assert text.count(f"\n[{clause.id}] ") == 1
    assert "11. AI Identity and Limits" in text


def test_default_charter_has_realistic_length():
    # 1,620 words: 2,167 tokens with a cl100k BPE (measured once, see bench/README.md);
    # the report's judge prompt carries a charter of about that size.
    words = len(load_charter().text().split())
    assert 1400 <= words <= 2000


def test_continuation_lines_join_the_clause(tmp_path):
    path = tmp_path / "c.md"
    path.write_text("# T\n\n## 1. One\n[1.1] Start of the clause\n    and its end.\n[1.2] Second.\n")
    charter = load_charter(path)
    assert charter.clause("1.1").text == "Start of the clause and its end."
    assert charter.source == str(path)
    assert charter.text() == "T\n\n1. One\n[1.1] Start of the clause and its end.\n[1.2] Second."


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("## 1. A\n[1.1] x\n## 3. C\n[3.1] y\n", 3, "article 3 found where article 2"),
        ("## 1. A\n[1.1] x\n[1.1] y\n", 3, "duplicate clause id: [1.1]"),
        ("## 1. A\n[1.1] x\n[1.3] y\n", 3, "clause numbering skips: [1.3]"),
        ("## 1. A\n[1.1] x\n## 2. B\n[1.2] y\n", 4, "[1.2] is filed under article 2"),
        ("## 1. A\n[1.1] x\n[1.2]   \n", 3, "clause [1.2] is empty"),
        ("## 1. A\n## 2. B\n[2.1] y\n", 1, "article 1 has no clauses"),
        ("## 1. A\n[1.1] x\n## 2. B\n", 3, "article 2 has no clauses"),
        ("## 1. A\n[1.1] x\nstray text\n", 3, "expected '## N. Title'"),
        ("[1.1] x\n", 1, "comes before any"),
        ("# Only a title\n", 1, "no articles found"),
        ("## 1.   \n[1.1] x\n", 1, "article 1 has no title"),
        ("## 1. A\n[1.1] x\n# Late title\n", 3, "may appear once"),
        ("## 1. A\n[1.1] x\n[1.2] as [1.1] says\n", 3, "contains the clause tag [1.1]"),
    ],
)
def test_malformed_charters_name_the_line(text, line, fragment):
    with pytest.raises(CharterError) as info:
        parse_charter(text, "bad.md")
    assert info.value.line == line
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"bad.md:{line}:")


def test_packaged_templates_have_their_placeholders():
    assert template_fields(load_template("judge_pointwise")) == {"charter", "question", "response", "scale_min", "scale_max"}
    assert template_fields(load_template("judge_pairwise")) == {"charter", "question", "response_a", "response_b"}
    assert template_fields(load_template("controversy_user")) == {"system_prompt", "first_user_message"}
    assert template_fields(load_template("controversy_system")) == set()
    assert template_fields(load_template("degrade")) == {"question", "response", "flaw", "flaw_description"}


def test_charter_folder_sits_next_to_the_packages():
    import rewards
    from rewards.charter import charter_dir

    assert charter_dir() == Path(rewards.__file__).resolve().parent.parent / "charter"
    assert {"default.md", "example_de.md", "judge_pointwise.txt", "judge_pairwise.txt", "controversy_system.txt",
            "controversy_user.txt", "degrade.txt"} <= {p.name for p in charter_dir().iterdir()}
    assert load_charter().source == "charter/default.md"


@pytest.mark.parametrize("name", ["charter/example_de.md", "example_de.md", "example_de"])
def test_bundled_charters_by_name_from_any_directory(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    charter = load_charter(name)
    assert charter.source == "charter/example_de.md"
    assert [a.number for a in charter.articles] == [1, 2, 3]
    text = charter.text()
    for clause in charter.clauses:  # every id quotable: it heads exactly one line
        assert text.count(f"\n[{clause.id}] ") == 1
    with pytest.raises(FileNotFoundError, match="no charter 'charter/nope.md'"):
        load_charter("charter/nope.md")


def test_every_bundled_charter_is_valid():
    from rewards.charter import charter_dir

    for path in sorted(charter_dir().glob("*.md")):
        assert load_charter(path).clauses, path


def test_template_from_a_file_and_unknown_names(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("$charter\nQ: $question\nR: $response\n")
    assert load_template(path).substitute(charter="C", question="q", response="r") == "C\nQ: q\nR: r"
    with pytest.raises(FileNotFoundError, match="no prompt template 'nope'"):
        load_template("nope")
