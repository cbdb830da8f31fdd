"""System-prompt families: 3 attributes x 11 prompts, attribute drawn uniformly first,
persona prompts for controversial prompts, draws reproducible per record id."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from align.sampling.system_prompts import (
    ATTRIBUTES,
    DEFAULT_PERSONAS,
    FAMILY_PROMPTS,
    charter_prompt,
    draw_system_prompt,
    load_personas,
)


def test_three_attributes_with_eleven_distinct_prompts_each():
    assert ATTRIBUTES == ("truthful", "helpful", "honest")
    assert set(FAMILY_PROMPTS) == set(ATTRIBUTES)
    texts = [t for family in ATTRIBUTES for t in FAMILY_PROMPTS[family]]
    assert all(len(FAMILY_PROMPTS[family]) == 11 for family in ATTRIBUTES)
    assert len(set(texts)) == 33 and all(len(t) > 40 for t in texts)


def test_attribute_is_uniform_then_each_prompt_is_used():
    draws = [draw_system_prompt(f"prompt-{i}", controversial=False, seed=0) for i in range(6000)]
    families = Counter(d.family for d in draws)
    assert set(families) == set(ATTRIBUTES)
    for family in ATTRIBUTES:  # expected 2000 each; binomial sd ~37
        assert 1800 < families[family] < 2200, families
        indices = Counter(d.index for d in draws if d.family == family)
        assert set(indices) == set(range(11))
        assert min(indices.values()) > 100  # expected ~182 each
    for d in draws[:50]:
        assert d.text == FAMILY_PROMPTS[d.family][d.index]
        assert d.tag == f"{d.family}/{d.index}"


def test_draws_depend_only_on_seed_and_record_id():
    a = [draw_system_prompt(f"r{i}", controversial=False, seed=3) for i in range(50)]
    b = [draw_system_prompt(f"r{i}", controversial=False, seed=3) for i in reversed(range(50))][::-1]
    c = [draw_system_prompt(f"r{i}", controversial=False, seed=4) for i in range(50)]
    assert a == b
    assert a != c


def test_controversial_prompts_get_a_persona():
    draws = [draw_system_prompt(f"c{i}", controversial=True, seed=0) for i in range(500)]
    assert {d.family for d in draws} == {"persona"}
    assert len({d.index for d in draws}) == len(DEFAULT_PERSONAS)
    d = draws[0]
    assert DEFAULT_PERSONAS[d.index] in d.text


def test_custom_persona_pool_and_empty_pool():
    d = draw_system_prompt("x", controversial=True, personas=["A lighthouse keeper on a remote island."])
    assert d.tag == "persona/0" and "lighthouse keeper" in d.text
    with pytest.raises(ValueError, match="persona pool is empty"):
        draw_system_prompt("x", controversial=True, personas=[])


def test_charter_prompt_is_its_own_family():
    assert charter_prompt().tag == "charter/0"


def test_load_personas_from_text_and_jsonl(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("A baker.\n\nA pilot.\n")
    assert load_personas(txt) == ["A baker.", "A pilot."]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"persona": "A baker."}) + "\n" + json.dumps({"persona": ""}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:2: expected a non-empty string field 'persona'"):
        load_personas(jsonl)
