"""The power manager: device detection and telemetry (sysfs.py), controllers that apply
and restore a power profile (controller.py), the saved state (state.py), and the
manager that ties them to the agent's lifetime (manager.py)."""
