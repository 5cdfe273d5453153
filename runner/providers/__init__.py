"""Providers: where nodes come from (local simulated market, AWS, GCP)."""
