"""SandboxPool resources: warm Pods of the kubernetes provider (kube/pool/controller.py)."""

from durable_sandbox.kube.pool.controller import PoolController, PoolSettings

__all__ = ["PoolController", "PoolSettings"]
