"""Session-wide setup: caches in a session temp dir, tiny fixtures, torch threads, the skip report.

Tests write only into temporary directories. The caches that libraries keep under $HOME
(the `datasets` cache, the Hub, matplotlib, torch's compiled extensions, Jupyter and IPython
state, vLLM) are pointed at one temp directory for the session, removed when it ends. This
happens when this file is imported, before any test module imports `datasets` or
`transformers`, and child processes (the CLI, launchers) inherit it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# --------------------------------------------------------------------------- caches out of $HOME

# Under mutation testing (tests/mutation/check.py) one process runs many pytest sessions: they share
# the first session's cache directory (the libraries read its paths once), removed when the process ends.
_SHARED = os.environ.get("ALIGN_TEST_CACHE_ROOT") if "MUTANT_UNDER_TEST" in os.environ else None
CACHE_ROOT = Path(_SHARED) if _SHARED and Path(_SHARED).is_dir() else Path(tempfile.mkdtemp(prefix="align-tests-caches-"))
if "MUTANT_UNDER_TEST" in os.environ and not _SHARED:
    import atexit

    os.environ["ALIGN_TEST_CACHE_ROOT"] = str(CACHE_ROOT)
    atexit.register(shutil.rmtree, CACHE_ROOT, ignore_errors=True)
CACHE_DIRS = {
    "HF_HOME": "huggingface",
    "HF_DATASETS_CACHE": "huggingface/datasets",
    "XDG_CACHE_HOME": "cache",  # pip, and whatever else follows the XDG convention
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "MPLCONFIGDIR": "matplotlib",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "IPYTHONDIR": "ipython",
    "JUPYTER_CONFIG_DIR": "jupyter/config",
    "JUPYTER_DATA_DIR": "jupyter/data",
    "JUPYTER_RUNTIME_DIR": "jupyter/runtime",
    "VLLM_CACHE_ROOT": "vllm",
}
for _name, _sub in CACHE_DIRS.items():
    os.environ[_name] = str(CACHE_ROOT / _sub)
    (CACHE_ROOT / _sub).mkdir(parents=True, exist_ok=True)
# DeepSpeed builds a CPU op on its first run (~45 s): a TORCH_EXTENSIONS_DIR set on purpose is
# kept (to reuse the build across sessions); otherwise the build goes into the session dir too.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(CACHE_ROOT / "torch_extensions"))

_EARLY = sorted(m for m in ("datasets", "transformers", "matplotlib") if m in sys.modules)
if _EARLY and not _SHARED:  # a plugin imported them before this file: they read their cache paths already
    raise pytest.UsageError(f"{_EARLY} were imported before tests/conftest.py set the cache directories")


if "MUTANT_UNDER_TEST" in os.environ:
    # `datasets` fingerprints each Dataset.map by hashing its function with dill. Under mutmut's
    # trampolines that hash walks every mutant of every module the function reaches (minutes per
    # map). Each map gets a fingerprint of its own instead, from the OS's randomness: mutmut forks
    # every test run from one parent, so a seeded generator would hand two runs the same "random"
    # fingerprint, and a file-backed dataset would read another map's cached result (a failure no
    # mutant caused, counted as a kill). Outside mutation testing the library's hashing runs as
    # users get it.
    import uuid

    import datasets.arrow_dataset
    import datasets.fingerprint

    def _unique_fingerprint(fingerprint, transform, transform_args):
        return uuid.uuid4().hex[:16]

    datasets.fingerprint.update_fingerprint = _unique_fingerprint
    datasets.arrow_dataset.update_fingerprint = _unique_fingerprint


def pytest_unconfigure(config):
    if "MUTANT_UNDER_TEST" not in os.environ:
        shutil.rmtree(CACHE_ROOT, ignore_errors=True)


# --------------------------------------------------------------------------- torch threads


@pytest.fixture()
def one_torch_thread():
    """One torch thread for this test (tiny models gain nothing from more; the cores are shared),
    restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _torch_threads_unchanged():
    """A test that changes torch's thread count must restore it (use ``one_torch_thread``)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if before is not None and torch.get_num_threads() != before:
        after = torch.get_num_threads()
        torch.set_num_threads(before)
        pytest.fail(f"the test left torch.get_num_threads() at {after} (was {before}): use the "
                    "one_torch_thread fixture, which restores it", pytrace=False)


# --------------------------------------------------------------------------- tiny models


@pytest.fixture()
def drawn(monkeypatch):
    """The matplotlib figures saved during the test, kept open to be read (the sweep's plots)."""
    from matplotlib.figure import Figure

    figures = []
    real = Figure.savefig

    def keep(self, path, **kwargs):
        figures.append(self)
        return real(self, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


@pytest.fixture()
def say(request):
    """A progress line past pytest's output capture: a test that runs for minutes says what it runs now."""
    import time

    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    start = time.monotonic()

    def write(text: str) -> None:
        if reporter is None or capture is None:
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"  [{request.node.name} +{time.monotonic() - start:.0f}s] {text}")

    return write


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Saved tiny policy and reward model dirs (each with the tokenizer); not the model with its own
    template, which reads TRL's template files (absent from the vLLM environment)."""
    from align.testing.tiny import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("tiny_models"), which=("policy", "reward_model"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from align.testing.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture()
def tokenizer(tiny_tokenizer):
    """A fresh copy per test, so tests may add tokens or templates freely."""
    import copy

    return copy.deepcopy(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from align.testing.tiny import build_causal_lm

    return build_causal_lm(tiny_tokenizer)


# --------------------------------------------------------------------------- the quick selection

# `python -m pytest -m quick` (README): every package in a couple of minutes on 2 cores, for a change's
# first check; the whole suite is what CI runs. The modules, chosen by their measured time (each under
# about 3 s of test time) and so that every package of align and rewards is reached
# (tests/test_test_hygiene.py checks that), are marked here rather than one by one.
QUICK_MODULES = frozenset({
    "tests/chat/test_chat_encode.py",
    "tests/chat/test_chat_install.py",
    "tests/chat/test_own_template.py",
    "tests/chat/test_template_probes.py",
    "tests/demo/test_demo_eta.py",
    "tests/demo/test_demo_grids.py",
    "tests/demo/test_demo_output_dir.py",
    "tests/demo/test_demo_round_wiring.py",
    "tests/demo/test_demo_rounds_plan.py",
    "tests/demo/test_demo_table.py",
    "tests/demo/test_graded_reward.py",
    "tests/eval/test_eval_callback.py",
    "tests/eval/test_eval_generate_together.py",
    "tests/eval/test_eval_kl.py",
    "tests/eval/test_eval_plots.py",
    "tests/eval/test_eval_stats.py",
    "tests/eval/test_one_engine_at_a_time.py",
    "tests/eval/test_rescore.py",
    "tests/jobs/test_jobs_runner.py",
    "tests/mutation/test_mutation_lists.py",
    "tests/rewards/test_annotate.py",
    "tests/rewards/test_charter_install.py",
    "tests/rewards/test_charter_paths.py",
    "tests/rewards/test_classifier.py",
    "tests/rewards/test_empty_completions.py",
    "tests/rewards/test_generation.py",
    "tests/rewards/test_judge.py",
    "tests/rewards/test_judge_robustness.py",
    "tests/rewards/test_openai_backend.py",
    "tests/rewards/test_pairwise.py",
    "tests/rewards/test_prompt_too_long.py",
    "tests/rewards/test_reward_config.py",
    "tests/rewards/test_reward_model.py",
    "tests/rewards/test_reward_model_token_budget.py",
    "tests/rewards/test_validation.py",
    "tests/rewards/test_verifiable_adversarial.py",
    "tests/sampling/test_engine_finish_reason.py",
    "tests/sampling/test_sampling_stages.py",
    "tests/sampling/test_system_prompts.py",
    "tests/sampling/test_tokenizer_template_thinking.py",
    "tests/sampling/test_transformers_sampler.py",
    "tests/sampling/test_vllm_missing.py",
    "tests/scoring/test_prefix_shared.py",
    "tests/scoring/test_tiled_logps.py",
    "tests/stages/test_judge_validate_stage.py",
    "tests/stages/test_own_template_training.py",
    "tests/stages/test_pairs_special_tokens.py",
    "tests/stages/test_pairs_stage.py",
    "tests/stages/test_recipes.py",
    "tests/stages/test_sft_hygiene_stage.py",
    "tests/stages/test_sft_mixed_messages.py",
    "tests/stages/test_slurm_resources.py",
    "tests/stages/test_stages_cli.py",
    "tests/stages/test_status.py",
    "tests/stages/test_tiny_models.py",
    "tests/test_ademamix.py",
    "tests/test_bootstrap.py",
    "tests/test_card.py",
    "tests/test_cli.py",
    "tests/test_cluster_events.py",
    "tests/test_coming_from_trl.py",
    "tests/test_config.py",
    "tests/test_config_bounds.py",
    "tests/test_dataset_columns.py",
    "tests/test_decontaminate.py",
    "tests/test_dependency_hooks.py",
    "tests/test_disks_and_files.py",
    "tests/test_doc_paths.py",
    "tests/test_errors.py",
    "tests/test_fingerprint.py",
    "tests/test_io_edges.py",
    "tests/test_layers.py",
    "tests/test_lifecycle.py",
    "tests/test_losses.py",
    "tests/test_manifest_rules.py",
    "tests/test_over_max_length.py",
    "tests/test_plan.py",
    "tests/test_quantiles_pairs.py",
    "tests/test_recipe.py",
    "tests/test_recipe_yaml.py",
    "tests/test_run_stage.py",
    "tests/test_settings_names.py",
    "tests/test_skip_rows.py",
    "tests/test_slurm_commands.py",
    "tests/test_stage_table.py",
    "tests/test_step_graph.py",
    "tests/test_sweep_plots.py",
    "tests/trainers/test_architectures.py",
    "tests/trainers/test_common.py",
    "tests/trainers/test_dpo_matches_trl.py",
    "tests/trainers/test_guards.py",
    "tests/trainers/test_loss_scale.py",
    "tests/trainers/test_preference_global_batch.py",
    "tests/trainers/test_reference_dtype.py",
    "tests/trainers/test_sft_hygiene.py",
    "tests/trainers/test_sft_long_rows.py",
    "tests/trainers/test_tensorboard.py",
    "tests/trainers/test_trainer_loss_values.py",
})


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parents[1]
    for item in items:
        if str(Path(item.fspath).resolve().relative_to(root)) in QUICK_MODULES:
            item.add_marker(pytest.mark.quick)


# --------------------------------------------------------------------------- skips

# THE allowed skips: the only tests that may be skipped in CI's main environment, with the
# reason they may give. The vLLM tests run for real in their own environment (.venv-vllm,
# `.ci/setup_vllm_env.sh`); in the main environment vllm is not installed and they skip.
# Every other skip is a test that silently did not run: with ALIGN_SKIP_REPORT set (as
# `.ci/run` does), the session writes every skip to that file and fails on one outside this
# set. Add an entry only for a test that cannot run in the main environment by design.
ALLOWED_SKIPS = (
    # (path prefix of the skipped test or module, regular expression its reason must match)
    ("tests/vllm/", r"^vllm is not (installed|importable here)"),
    # torch 2.13 runs FlexAttention's forward on CPU, not its backward; the test runs on GPUs
    ("tests/scoring/test_flex_attention.py::test_flex_gradients_equal_masked_sdpa_where_torch_has_the_backward",
     r"^FlexAttention backward is not implemented on CPU"),
)
SKIP_REPORT_ENV = "ALIGN_SKIP_REPORT"

_skipped: list[dict] = []


def _record_skip(report) -> None:
    if not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    path, _line, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, str(report.longrepr))
    reason = reason.removeprefix("Skipped: ")
    nodeid = report.nodeid or str(path)
    allowed = any(nodeid.startswith(prefix) and re.search(pattern, reason) for prefix, pattern in ALLOWED_SKIPS)
    _skipped.append({"nodeid": nodeid, "reason": reason, "allowed": allowed})


def pytest_runtest_logreport(report):
    _record_skip(report)


def pytest_collectreport(report):
    _record_skip(report)  # a module skipped as a whole (`pytest.importorskip`, allow_module_level)


def pytest_sessionfinish(session, exitstatus):
    target = os.environ.get(SKIP_REPORT_ENV)
    if not target:
        return
    Path(target).write_text("".join(json.dumps(entry) + "\n" for entry in _skipped))
    if any(not entry["allowed"] for entry in _skipped) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    unexpected = [entry for entry in _skipped if not entry["allowed"]]
    if unexpected and os.environ.get(SKIP_REPORT_ENV):
        terminalreporter.section("skips outside the allowed set (tests/conftest.py, ALLOWED_SKIPS)", red=True)
        for entry in unexpected:
            terminalreporter.write_line(f"{entry['nodeid']}: {entry['reason']}")
