"""The rule-based degrader on hand-written examples (one per flaw kind it imitates), the
LLM degrader's prompts, and ladder building."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rewards.degrade import (
    FLAW_KINDS,
    OFF_TASK_PASSAGES,
    LLMDegrader,
    RuleDegrader,
    build_ladders,
    sentences,
)

RULES = RuleDegrader()
Q = [{"role": "user", "content": "Tell me about Paris."}]
PROSE = ("Paris is the capital of France. It has about 2.1 million inhabitants. The city might be crowded in summer. "
         "Its best known landmark is the Eiffel Tower, built in 1889.")
LIST = "To make tea:\n1. Boil water.\n2. Pour it over the leaves.\n3. Wait about 3 minutes.\n- **Enjoy** it."


def test_the_eleven_kinds_and_what_the_rules_cannot_do():
    assert len(FLAW_KINDS) == 11
    assert set(RULES.kinds) | set(RULES.cannot) == set(FLAW_KINDS)
    assert not set(RULES.kinds) & set(RULES.cannot)
    assert set(RULES.cannot) == {"factual_accuracy", "skipped_instructions", "faulty_reasoning"}
    with pytest.raises(ValueError, match="cannot imitate 'faulty_reasoning'"):
        RULES.apply(PROSE, "faulty_reasoning", 0)


def test_incompleteness_truncates_mid_sentence():
    out = RULES.apply(PROSE, "incompleteness", 0)
    # 30 words, the first int(30 * 0.55) = 16 kept
    assert out == "Paris is the capital of France. It has about 2.1 million inhabitants. The city might be"
    assert RULES.apply("Too short to cut.", "incompleteness", 0) is None


def test_organisation_shuffles_sentences_or_lines():
    out = RULES.apply(PROSE, "organisation", 3)
    assert sorted(sentences(out)) == sorted(sentences(PROSE)) and sentences(out) != sentences(PROSE)
    lines = RULES.apply(LIST, "organisation", 3).splitlines()
    assert sorted(lines) == sorted(LIST.splitlines()) and lines != LIST.splitlines()
    assert RULES.apply("One sentence only.", "organisation", 0) is None


def test_off_task_inserts_an_unrelated_passage_in_the_middle():
    out = RULES.apply(PROSE, "off_task", 1)
    parts = sentences(out)
    inserted = [p for p in parts if p in OFF_TASK_PASSAGES]
    assert len(inserted) == 1 and parts.index(inserted[0]) == 2
    assert [p for p in parts if p not in OFF_TASK_PASSAGES] == sentences(PROSE)
    lines = RULES.apply(LIST, "off_task", 1).splitlines()
    assert lines[2] in OFF_TASK_PASSAGES and [x for x in lines if x not in OFF_TASK_PASSAGES] == LIST.splitlines()


def test_wrong_answer_changes_every_number_but_list_markers():
    out = RULES.apply(PROSE, "wrong_answer", 2)
    before, after = re.findall(r"\d+(?:\.\d+)?", PROSE), re.findall(r"\d+(?:\.\d+)?", out)
    assert len(before) == len(after) == 2
    assert all(a != b for a, b in zip(before, after))
    assert after[0].endswith(".1") and 2 < float(after[0]) <= 11.1
    assert re.sub(r"\d+(?:\.\d+)?", "N", out) == re.sub(r"\d+(?:\.\d+)?", "N", PROSE)  # only numbers changed
    listed = RULES.apply(LIST, "wrong_answer", 2)
    assert listed.splitlines()[1:3] == ["1. Boil water.", "2. Pour it over the leaves."]
    assert "about 3 minutes" not in listed
    assert RULES.apply("No digits here at all.", "wrong_answer", 0) is None


def test_ignored_format_removes_the_formatting():
    assert RULES.apply(LIST, "ignored_format", 0) == "To make tea: Boil water. Pour it over the leaves. Wait about 3 minutes. Enjoy it."
    assert RULES.apply(PROSE, "ignored_format", 0) is None  # nothing to ignore


def test_inappropriate_certainty_adds_overconfident_phrases():
    out = RULES.apply(PROSE, "inappropriate_certainty", 0)
    assert out == ("This is the only correct answer, without any doubt. Paris is the capital of France. It has exactly 2.1 "
                   "million inhabitants. The city will be crowded in summer. Its best known landmark is the Eiffel Tower, "
                   "built in 1889. This is absolutely certain, and no expert would dispute it.")


def test_language_quality_adds_typos():
    out = RULES.apply(PROSE, "language_quality", 5)
    words_before, words_after = PROSE.split(), out.split()
    assert len(words_before) == len(words_after)
    changed = [(a, b) for a, b in zip(words_before, words_after) if a != b]
    assert 1 <= len(changed) <= len(words_before) // 3
    for a, b in changed:  # two letters swapped, or one dropped
        assert (sorted(a) == sorted(b) and len(a) == len(b)) or (len(b) == len(a) - 1)


def test_logical_coherence_adds_a_contradiction():
    out = RULES.apply(PROSE, "logical_coherence", 0)
    assert out == PROSE + " At the same time, Paris is not the capital of France."
    assert RULES.apply("Nothing here. Just words.", "logical_coherence", 0) is None


def test_ladders_add_one_new_flaw_per_step():
    items = [("prose", Q, PROSE, "en"), ("list", Q, LIST, "en"), ("short", Q, "Yes.", "en"), ("empty", Q, " ", None)]
    ladders, skipped = build_ladders(items, RULES, steps=4, seed=1)
    assert [ladder.id for ladder in ladders] == ["prose", "list"]
    assert {s["id"]: s["reason"] for s in skipped} == {"empty": "empty good completion",
                                                       "short": "fewer applicable flaw kinds than steps"}
    for ladder in ladders:
        assert ladder.steps == 4 and len(set(ladder.flaws)) == 4 and len(set(ladder.texts)) == 5
        assert ladder.flaws == sorted(ladder.flaws, key=RuleDegrader.ORDER.index)  # applied in ORDER
        for step, kind in enumerate(ladder.flaws, start=1):  # each step is the previous plus its flaw
            assert RULES.apply(ladder.texts[step - 1], kind, 0) is not None
    again, _ = build_ladders(items, RULES, steps=4, seed=1)
    assert [lad.texts for lad in again] == [lad.texts for lad in ladders]  # seeded
    with pytest.raises(ValueError, match="cannot imitate"):
        build_ladders(items, RULES, kinds=["factual_accuracy", "incompleteness"], steps=1)


def test_llm_degrader_prompts_and_failures():
    seen, seeds = [], []

    def generate(conversations, seed=0):
        seen.extend(conversations)
        seeds.append(seed)
        out = []
        for c in conversations:
            text = c[0]["content"]
            if "off task" in text:
                out.append("Rewritten response: " + PROSE + " Also, cats sleep a lot.")
            elif "wrong answer" in text:
                out.append(PROSE)  # unchanged: a failure
            else:
                out.append("  ")
        return out

    degrader = LLMDegrader(generate, model="fake")
    got = degrader.degrade([(Q, PROSE, "off_task", 7), (Q, PROSE, "wrong_answer", 8), (Q, PROSE, "faulty_reasoning", 9)])
    assert got == [PROSE + " Also, cats sleep a lot.", None, None]
    assert seeds == [[7, 8, 9]]  # each rewrite is drawn with its item's seed
    prompt = seen[0][0]["content"]
    assert "Tell me about Paris." in prompt and PROSE in prompt and FLAW_KINDS["off_task"] in prompt
    assert set(degrader.kinds) == set(FLAW_KINDS) and not degrader.cannot


def test_llm_ladders_try_another_kind_when_a_rewrite_fails():
    def generate(conversations, seed=0):
        out = []
        for c in conversations:
            text = c[0]["content"]
            flaw = re.search(r"FLAW TO ADD: (.*)", text).group(1)
            response = text.split("RESPONSE:\n", 1)[1].split("\n\nFLAW TO ADD", 1)[0]
            out.append("" if flaw.startswith("faulty reasoning") else response + f" [{flaw}]")
        return out

    ladders, skipped = build_ladders([("p", Q, PROSE, None)], LLMDegrader(generate), steps=3, seed=0)
    assert not skipped and ladders[0].steps == 3 and "faulty_reasoning" not in ladders[0].flaws
    assert Counter(ladders[0].texts[-1].count("[") for _ in [0]) == Counter({3: 1})


def test_the_application_order_is_a_declared_capability():
    """`Degrader.ORDER` is declared on the base class (None: one flaw at a time on the
    previous text); a degrader that declares an order gets its flaws applied in it."""
    from rewards.degrade import Degrader

    assert Degrader.ORDER is None and LLMDegrader.ORDER is None and RuleDegrader.ORDER == tuple(RuleDegrader.TRANSFORMS)

    class Tagger(Degrader):
        """Appends a tag per kind; declares the reverse alphabetical order."""

        name = "tagger"
        kinds = ("off_task", "incompleteness", "wrong_answer")
        ORDER = ("wrong_answer", "off_task", "incompleteness")

        def degrade(self, items):
            return [text + f" <{kind}>" for _, text, kind, _ in items]

    ladders, skipped = build_ladders([("a", Q, "Good.", None), ("b", Q, "Fine.", None)], Tagger(), steps=2, seed=0)
    assert not skipped
    for ladder in ladders:
        assert ladder.flaws == sorted(ladder.flaws, key=Tagger.ORDER.index) and ladder.steps == 2
        assert ladder.texts[-1].count("<") == 2


def test_build_ladders_is_pure():
    """New ladders each call; the items (conversations, texts) are left as they were."""
    import copy

    items = [("prose", Q, PROSE, "en"), ("list", Q, LIST, None), ("short", Q, "Yes.", "en")]
    before = copy.deepcopy(items)
    first, skipped_first = build_ladders(items, RULES, steps=3, seed=2)
    second, skipped_second = build_ladders(items, RULES, steps=3, seed=2)
    assert items == before
    assert [lad.to_dict() for lad in first] == [lad.to_dict() for lad in second] and skipped_first == skipped_second
    for a, b in zip(first, second):
        assert a is not b and a.texts is not b.texts and a.flaws is not b.flaws
        assert a.texts[0] == {i: t for i, _, t, _ in items}[a.id]
    llm_items = [("p", Q, PROSE, None)]
    ladders, _ = build_ladders(llm_items, LLMDegrader(lambda convs, seed=0: [f"rewrite {n}" for n in range(len(convs))]),
                               steps=1, seed=0)
    assert llm_items == [("p", Q, PROSE, None)] and ladders[0].texts[0] == PROSE
