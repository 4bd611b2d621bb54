"""Benchmarks of Turnstile on the local PostgreSQL (see ``docs/performance.md``)."""
