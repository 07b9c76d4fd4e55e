"""Kubernetes binder adapters: the API (lightkube), Placement (gRPC) and the control loop."""
