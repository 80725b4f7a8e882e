"""Competing RQ workers: gate, CAS reservation with lease and fence, handler, completion."""
