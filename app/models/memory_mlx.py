"""Free unified memory for MLX on Apple Silicon: Metal's recommended working set less what MLX
holds now (the pair in use, which the caller may count back as reclaimable). Beyond that
limit macOS pages GPU memory and everything crawls. psutil's "available" is not used there:
on macOS it counts only free and inactive pages, and the system makes room well beyond it.
Without Metal (the CPU build on Linux) the limit is the RAM psutil reports available."""

from __future__ import annotations


def free_unified_memory() -> int:
    import psutil

    try:
        import mlx.core as mx

        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        limit = int(info.get("max_recommended_working_set_size") or 0)
        active = int(mx.get_active_memory()) if hasattr(mx, "get_active_memory") else 0
    except Exception:  # no Metal device
        limit = active = 0
    if limit:
        return max(limit - active, 0)
    return int(psutil.virtual_memory().available)
