"""moe_dispatch points for tests, written as (form, grid_blocks, warps, tokens_per_block[,
cache_hints]) and built through the space, as a stored point is read back."""

from cutetune.kernels.moe_dispatch.space import SPACE


def point(form: str, grid_blocks: int, warps_per_block: int, tokens_per_block: int,
          cache_hints: str | None = None):
    knobs = {"form": form, "grid_blocks": grid_blocks, "warps_per_block": warps_per_block,
             "tokens_per_block": tokens_per_block}
    if cache_hints is not None:
        knobs["cache_hints"] = cache_hints
    return SPACE.config_from_dict(knobs)
