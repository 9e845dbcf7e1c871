"""PySide6 windows and widgets. Never imports mlx or torch: the engine reaches us as signals."""
