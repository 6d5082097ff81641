"""DRA objects for the tests, shaped like NVIDIA's DRA driver's (tests/data/dra: composed by hand from the real H200's
values, not captured; its README says so)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "dra"
NVIDIA = "gpu.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"
T4 = "Tesla T4"


def load(name: str) -> Any:
    """A file of tests/data/dra, parsed."""
    return json.loads((DATA / name).read_text())


def gpu_slice(node: str, product: str, gpus: int, driver: str = NVIDIA, name: str = "",
              memory: str | None = None) -> dict[str, Any]:
    """A slice shaped like the H200 fixture's, for `gpus` devices of `product` on `node` (its pool), each with
    `memory` capacity when given."""
    obj = load("resourceslice-nvidia-h200-composed.json")
    template = obj["spec"]["devices"][0]
    devices = []
    for minor in range(gpus):
        device = copy.deepcopy(template)
        device["name"] = f"gpu-{minor}"
        device["attributes"]["productName"] = {"string": product}
        if memory is not None:
            device["capacity"]["memory"] = {"value": memory}
        devices.append(device)
    obj["metadata"]["name"] = name or f"{node}-{driver}"
    obj["spec"].update(driver=driver, nodeName=node, devices=devices, pool={"name": node})
    return obj
