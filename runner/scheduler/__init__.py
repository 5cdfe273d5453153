"""Scheduling: job states and transitions, per-state workers, and the offer policy."""
