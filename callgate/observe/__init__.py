"""Observers: Prometheus counters, histograms and the gauges read from Postgres and Redis."""
