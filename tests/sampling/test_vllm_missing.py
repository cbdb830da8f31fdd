"""Without vLLM, the sampler's error names the backends that sample without it."""

from __future__ import annotations

import sys

import pytest

from align.errors import MissingDependencyError


def test_the_missing_vllm_error_names_the_other_backends(monkeypatch):
    from align.sampling.vllm_backend import VLLMSampler

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as where it is not installed
    with pytest.raises(MissingDependencyError) as caught:
        VLLMSampler("some/model")
    message = str(caught.value)
    assert "pip install 'align[vllm]'" in message and "sampler.backend=transformers" in message
    assert "sampler.backend=openai" in message
