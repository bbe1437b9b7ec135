"""The pure core: every decision, no I/O (render, plan, status, vetting, the driver upgrade)."""
