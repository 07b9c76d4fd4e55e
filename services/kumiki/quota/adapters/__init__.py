"""Adapters of the quota service: Postgres store, ledger consumer, gRPC Quota, caller identity, publishers."""
