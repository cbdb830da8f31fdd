"""What a stage's output was made from, and the rules for rerunning a stage over it.

Every stage output directory carries a manifest: the resolved settings (less the keys that
cannot change an output, ``NEUTRAL_KEYS``, and anything secret), a content fingerprint of
every input the settings name (a file's bytes; a model directory's files; for another
stage's output, that stage's manifest fingerprint and output id, so a chain is checked
without rehashing it), the charter's hash, and the library version. It is written to
``_manifest.json`` when the stage starts (before any work, so a partial output is bound to
its settings too) and into ``_COMPLETE.json`` when it finishes. The library version is
recorded, not compared: an upgrade does not redo finished work.

- ``settings``: which settings count (``NEUTRAL_KEYS``, ``STAGE_NEUTRAL_KEYS``,
  ``PATH_KEYS``, ``is_path_key``) and their declared defaults.
- ``redaction``: secrets kept out (``is_secret_key``, ``redact``).
- ``inputs``: content fingerprints of inputs (``fingerprint_input``, ``dir_key``,
  ``row_digests``).
- ``manifest``: ``Manifest`` and ``build_manifest``.
- ``differences``: one line per difference (``differences``, ``explain``).
- ``state``: the manifest files of an output directory (``recorded_manifest``).
- ``rerun``: the rules every stage applies (``begin``, ``start``, ``completion_fields``,
  ``StaleOutputError``).
- ``outputs``: the files a finished output holds, and whether they changed since.
- ``lifecycle``: ``StageRun``, the one object every stage runs its edges through.
- ``status``: where a recipe's steps stand (``step_state``), for ``align status`` and ``align submit``.
"""

from align.manifests.differences import differences, explain
from align.manifests.inputs import dir_key, fingerprint_input, row_digests
from align.manifests.lifecycle import StageRun
from align.manifests.manifest import Manifest, build_manifest
from align.manifests.redaction import is_secret_key, redact
from align.manifests.rerun import (
    Begun,
    StaleOutputError,
    begin,
    completion_fields,
    start,
)
from align.manifests.settings import NEUTRAL_KEYS, PATH_KEYS, STAGE_NEUTRAL_KEYS, is_path_key
from align.manifests.state import MANIFEST_FILE, recorded_manifest

__all__ = [
    "MANIFEST_FILE",
    "NEUTRAL_KEYS",
    "PATH_KEYS",
    "STAGE_NEUTRAL_KEYS",
    "Begun",
    "Manifest",
    "StageRun",
    "StaleOutputError",
    "begin",
    "build_manifest",
    "completion_fields",
    "differences",
    "dir_key",
    "explain",
    "fingerprint_input",
    "is_path_key",
    "is_secret_key",
    "recorded_manifest",
    "redact",
    "row_digests",
    "start",
]
