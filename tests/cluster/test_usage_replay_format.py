"""The e2e replay (tests/e2e/usage_replay.py) writes what dcgm-exporter writes: exposition text that Prometheus'
own parser reads, the exporter's label names in its template's order, and the real H200's memory."""

from __future__ import annotations

from e2e.usage_replay import H200_MIB, H200_UUID, exposition, fleet
from prometheus_client.parser import text_string_to_metric_families

PODS = {name: name for name in ("ts-1", "ts-2", "ts-3", "ts-4", "notebook", "trainer", "embedder", "mig-infer")}


def test_the_replay_is_exposition_text_in_the_exporters_label_order() -> None:
    text = exposition(fleet(PODS, 30), "ml", 1_796_000_000)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                             "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    first = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    names = [pair.split("=")[0] for pair in first.split("{", 1)[1].split("}")[0].split(",")]
    assert names[:5] == ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
    assert names[-4:] == ["container", "namespace", "pod", "vgpu"]
    samples = [s for f in families.values() for s in f.samples if s.labels.get("UUID") == H200_UUID]
    assert {s.labels["pod"] for s in samples} == {"ts-1", "ts-2", "ts-3", "ts-4"}
    assert {s.labels["vgpu"] for s in samples} == {"0", "1", "2", "3"}
    at = samples[0].timestamp
    memory = {s.name: s.value for s in samples if s.timestamp == at and s.labels["pod"] == "ts-1"}
    assert memory["DCGM_FI_DEV_FB_USED"] + memory["DCGM_FI_DEV_FB_FREE"] + memory["DCGM_FI_DEV_FB_RESERVED"] == H200_MIB
    assert {s.labels["modelName"] for s in samples} == {"NVIDIA H200"}
