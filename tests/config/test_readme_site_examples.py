"""The README's `[site_prometheus]` examples (DCGM, AMD) are configurations the daemon accepts."""

from __future__ import annotations

import re
from pathlib import Path

from jobdiagd.config import loads
from jobdiagd.tsdb.site import resolve

README = Path(__file__).resolve().parents[2] / "README.md"


def examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### The site Prometheus", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```toml\n(.*?)```", section, flags=re.S)


def test_the_dcgm_and_amd_examples_load_and_map_their_exporters() -> None:
    dcgm, amd = examples()
    d = loads(dcgm).site_prometheus
    assert d.enabled and d.profile == "dcgm" and d.auth == "bearer" and d.secret_credential
    a = loads(amd).site_prometheus
    assert a.profile == "amd" and a.ssh_host == "login1" and a.exclusive_nodes
    names = resolve(a.profile, a.metrics.overrides())
    power = names.get("power")
    assert power is not None and power.names == ("amd_gpu_power_usage",)
    assert power.host_label == "hostname"  # the override changes the name only
