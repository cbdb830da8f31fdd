"""Memory plans: bytes per GPU of each stage of a recipe, from the model's config.json alone.

``shapes`` (a model's shape and parameter count, by formula and on the meta device),
``configs`` (where a config.json comes from, offline), ``optimizer_states`` (what an
optimizer keeps, read off the optimizer), ``memory`` (the formulas), ``deepspeed_check``
(DeepSpeed's own estimators beside ours), ``advice`` (the smallest change that fits) and
``report`` (the table and the JSON). docs/memory-plan.md writes every formula down.
"""
