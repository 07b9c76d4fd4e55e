"""Numbers as Kubernetes writes them ("500m", "1.5Gi"), and the error every reading of a pod's spec raises."""

from __future__ import annotations

import math
import re

MIB = 1024 * 1024


class PodSpecError(ValueError):
    """A pod that cannot be turned into a request; the message names the field (shown on the pod)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where


_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(value: object, where: str) -> float:
    """A Kubernetes resource quantity ("500m", "2", "1.5Gi") as a plain number."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise PodSpecError(where, f"not a quantity: {text!r}")
    number = float(match.group(1)) * _SUFFIX[match.group(2) or ""]
    if not math.isfinite(number):
        raise PodSpecError(where, f"not a finite quantity: {text!r}")
    return number
