"""The vocabulary every quota rule shares: the any-model key, the float tolerance and the resource vector
that dominant-resource fairness compares."""

from __future__ import annotations

from dataclasses import dataclass

ANY_MODEL = ""
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Resources:
    """GPUs, CPU (millicores) and memory (MiB): the dimensions dominant-resource fairness compares."""

    gpus: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpu_milli + other.cpu_milli, self.memory_mib + other.memory_mib)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpus - other.gpus, self.cpu_milli - other.cpu_milli, self.memory_mib - other.memory_mib)

    def scaled(self, factor: float) -> Resources:
        return Resources(self.gpus * factor, self.cpu_milli * factor, self.memory_mib * factor)

    def clipped(self) -> Resources:
        return Resources(max(0.0, self.gpus), max(0.0, self.cpu_milli), max(0.0, self.memory_mib))

    def fits_in(self, other: Resources) -> bool:
        return (
            self.gpus <= other.gpus + EPSILON
            and self.cpu_milli <= other.cpu_milli + EPSILON
            and self.memory_mib <= other.memory_mib + EPSILON
        )

    def dominant_share(self, capacity: Resources) -> float:
        shares = [
            value / total
            for value, total in (
                (self.gpus, capacity.gpus),
                (self.cpu_milli, capacity.cpu_milli),
                (self.memory_mib, capacity.memory_mib),
            )
            if total > 0
        ]
        return max(shares, default=0.0)
