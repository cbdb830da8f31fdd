"""The pipeline's stages, one module each: a ``Config`` dataclass (its recipe keys) and ``run(config)``.

A stage reads and writes datasets on disk and says what it reads and writes; the lifecycle
around it (``align.manifests.lifecycle.run_stage``: skip, resume, redo, locks, completion)
is the same for every stage. What each stage is (its job kind, its row contract, its
neutral keys...) is one entry of ``align.stage_table``. Components (chat formats, losses,
samplers, reward providers) live elsewhere; a stage only wires them to a recipe.
"""
