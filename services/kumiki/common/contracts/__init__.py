"""Kumiki's contracts: code generated from proto/kumiki/v1 lives in the `v1` subpackage."""
