"""Free unified memory for MLX: what the system has available, but no more than Metal's
recommended working set (beyond it, macOS pages GPU memory and everything crawls)."""

from __future__ import annotations


def free_unified_memory() -> int:
    import psutil

    available = int(psutil.virtual_memory().available)
    try:
        import mlx.core as mx

        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        limit = int(info.get("max_recommended_working_set_size") or 0)
    except Exception:  # the CPU build (Linux) has no Metal device: RAM is the limit
        limit = 0
    return min(available, limit) if limit else available
