"""examples/quickstart.ipynb runs top to bottom in a real Jupyter kernel (nbclient + ipykernel).

Any error fails, and so does a code cell that shows nothing: every cell of the notebook
prints, displays a table or draws, so an empty output means a step silently did nothing.
Cells tagged ``plot`` must show a PNG inline.
"""

from __future__ import annotations

from pathlib import Path

import ipykernel  # noqa: F401  (the kernel nbclient starts; a dev dependency, like the two below)
import nbclient
import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


def _kinds(cell) -> set[str]:
    kinds = set()
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream" and out.get("name") == "stdout" and out["text"].strip():
            kinds.add("text")
        elif out["output_type"] in ("display_data", "execute_result"):
            kinds.update(out["data"])
        elif out["output_type"] == "error":
            kinds.add("error")
    return kinds


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs (they are made here)"
    monkeypatch.setenv("QUICKSTART_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    for i, cell in enumerate(code):
        kinds = _kinds(cell)
        first_line = cell.source.splitlines()[0]
        assert "error" not in kinds, f"code cell {i} ({first_line}) raised"
        assert kinds, f"code cell {i} ({first_line}) shows no output"
        if "plot" in cell.metadata.get("tags", []):
            assert "image/png" in kinds, f"code cell {i} ({first_line}) should draw a plot, shows {kinds}"
    out = tmp_path / "out"
    for name in ("sft/model.safetensors", "qrpo/model.safetensors", "eval/report.md", "eval/rewards.png"):
        assert (out / name).is_file(), name
    assert list((out / "qrpo" / "runs").rglob("events.out.tfevents.*"))
    # the evaluation table is shown, with both policies
    table = "".join(o["data"].get("text/markdown", "") for c in code for o in c.outputs
                    if o["output_type"] == "display_data")
    assert "qrpo" in table and "sft" in table
