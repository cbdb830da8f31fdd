"""DeepSpeed's own estimate of the model states per GPU, beside the plan's.

``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
``stage3.estimate_zero3_model_states_mem_needs`` assume mixed-precision Adam: 2Ψ of 16-bit
weights (sharded under ZeRO-3, where they add 4 bytes per parameter of the largest layer)
and 18 bytes per parameter over N ranks (16-bit and fp32 gradients 2 + 4, fp32 master
weights 4, Adam's two moments 8). The plan differs where align differs (docs/memory-plan.md,
"DeepSpeed's estimators"): AdEMAMix keeps a third moment (22 bytes, not 18), the 16-bit
weights' own ZeRO-3 shard (2Ψ/N) is counted, and under ZeRO-3 fp32 gradients exist for one
optimizer sub-group at a time.
"""

from __future__ import annotations


def deepspeed_estimate(num_params: int, largest_layer_params: int, zero_stage: int,
                       gpus_per_node: int, nodes: int) -> int | None:
    """DeepSpeed's GPU bytes for the model states (no offload), or None without DeepSpeed
    (not installed, or ZeRO stage 0/1, for which it has no estimator)."""
    try:
        if zero_stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

            _, gpu = estimate_zero2_model_states_mem_needs(num_params, gpus_per_node, nodes, cpu_offload=False)
            return int(gpu)
        if zero_stage == 3:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

            _, gpu, _ = estimate_zero3_model_states_mem_needs(
                num_params, largest_layer_params, gpus_per_node, nodes, cpu_offload=False, cpu_offload_params=False)
            return int(gpu)
    except ImportError:
        return None
    return None
