"""Shared prompts and completions for the reward tests."""

from __future__ import annotations


def prompt(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


QUESTIONS = [
    "What is the capital of France?",
    "How should a city reduce traffic in its old town while keeping shops reachable?",
    "Name a prime number.",
]
ANSWERS = [
    "Paris.",
    (
        "Close the centre to through traffic, add park-and-ride at the edges and run frequent buses; "
        "keep delivery windows in the morning so shops stay supplied."
    ),
    "7",
    "I am not sure.",
    "",
]
