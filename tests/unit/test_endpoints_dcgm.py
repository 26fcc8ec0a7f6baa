"""The dcgm-exporter stand-in prints what dcgm-exporter prints, in valid Prometheus text."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.model import GpuReading, GpuSample
from pipeline.sim.endpoints.dcgm_exporter import DcgmExporter, render_exposition

SAMPLE = GpuSample(
    ts=1_764_424_800_123,
    cluster="c1",
    node="ip-10-0-180-136.ec2.internal",
    pool="a3",
    zone="us-a",
    driver="580.105.08",
    gpus=[
        GpuReading(
            index=0,
            uuid="GPU-15704b32-f531-14ce-0530-1ac21e4b68e6",
            pci_bus_id="00000000:53:00.0",
            model="NVIDIA H100 80GB HBM3",
            metrics={
                "DCGM_FI_DEV_GPU_TEMP": 31.0,
                "DCGM_FI_DEV_POWER_USAGE": 302.206,
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1893401233412.0,
                "DCGM_FI_DEV_SOMETHING_NEW": 2.5,
            },
        ),
        GpuReading(
            index=1,
            uuid="GPU-2b3e7c10-9f0d-44a1-8e52-0c7f3a9d1b24",
            pci_bus_id="00000000:64:00.0",
            model='NVIDIA "odd" model',
            job="trainer-0",
            metrics={"DCGM_FI_DEV_GPU_TEMP": 40.0},
        ),
    ],
)


def test_first_line_is_the_real_exporter_line() -> None:
    text = render_exposition([SAMPLE], timestamps=False)
    assert (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-15704b32-f531-14ce-0530-1ac21e4b68e6",'
        'pci_bus_id="00000000:53:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
        'Hostname="ip-10-0-180-136.ec2.internal",DCGM_FI_DRIVER_VERSION="580.105.08"} 31\n'
    ) in text
    assert "DCGM_FI_DEV_POWER_USAGE{" in text and "} 302.206000\n" in text  # Go's %f
    assert "} 1893401233412\n" in text  # integers print as integers


def test_exposition_parses_with_types_help_labels_and_timestamps() -> None:
    families = {f.name: f for f in text_string_to_metric_families(render_exposition([SAMPLE]))}
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    # the client strips _total from counter family names; the sample keeps the full name
    energy = families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.type == "counter"
    assert energy.documentation  # HELP text from the DCGM field catalog
    assert families["DCGM_FI_DEV_SOMETHING_NEW"].type == "gauge"  # not catalogued: gauge
    temps = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert temps["1"].labels["modelName"] == 'NVIDIA "odd" model'  # escaped and read back
    assert (temps["1"].labels["pod"], temps["1"].labels["namespace"]) == ("trainer-0", "default")
    assert "pod" not in temps["0"].labels
    assert temps["0"].timestamp == pytest.approx(1_764_424_800.123)
    assert temps["0"].labels["DCGM_FI_DRIVER_VERSION"] == "580.105.08"


def test_nothing_to_serve_is_an_empty_page() -> None:
    assert render_exposition([]) == ""


def test_http_endpoint_serves_metrics_only() -> None:
    with DcgmExporter() as exporter:
        exporter.update(SAMPLE)
        with urllib.request.urlopen(f"http://{exporter.address}/metrics", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = response.read().decode()
        assert body == exporter.render()
        # the handler counts a scrape served after its last write, which the client may
        # have read before the count moves
        deadline = time.monotonic() + 5
        while exporter.scrapes_served < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert exporter.scrapes_started == exporter.scrapes_served == 1
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://{exporter.address}/other", timeout=5)
        assert missing.value.code == 404
