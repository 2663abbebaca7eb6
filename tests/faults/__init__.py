"""The fault suite: qftrio as real processes, under faults (docs/reliability.md)."""
