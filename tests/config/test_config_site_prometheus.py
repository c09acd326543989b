"""[site_prometheus]: validated like every section; its map resolved, its secret read when built."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from jobdiagd.config import ConfigError, loads, restart_required
from jobdiagd.service.site_source import build_site_source, placement_for, site_config

GOOD = """
[site_prometheus]
enabled = true
url = "http://prometheus.example.org:9090/prom"
profile = "amd"
[site_prometheus.metrics.power]
name = "amd_gpu_power_usage"
[site_prometheus.metrics]
util = { name = "amd_gpu_gfx_activity" }
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        loads(text, source="c.toml", base_dir=Path("/etc/jobdiagd"))
    return info.value.errors


def test_a_section_with_overrides_builds_the_source() -> None:
    cfg = loads(GOOD, source="c.toml")
    site = site_config(cfg)
    assert site is not None
    assert site.metrics.profile == "amd"
    assert site.metrics.get("power").names == ("amd_gpu_power_usage",)
    assert site.metrics.get("util").names == ("amd_gpu_gfx_activity",)
    assert site.metrics.get("mem_activity").names == ("gpu_umc_activity",)
    assert (site.scrape_interval_s, site.max_in_flight, site.timeout_s) == (15.0, 4, 5.0)
    assert site.idle_vram_bytes == 2 * 2**30
    assert site.authorization is None
    source = build_site_source(cfg)
    assert source is not None and source.label == "http://prometheus.example.org:9090/prom"
    assert build_site_source(loads("", source="c.toml")) is None


def test_every_mistake_is_one_line_naming_the_key() -> None:
    errs = errors_of(
        """
[site_prometheus]
enabled = true
profil = "dcgm"
max_in_flight = 0
[site_prometheus.metrics.util]
nmae = "x"
"""
    )
    assert "c.toml: [site_prometheus] profil: unknown key (did you mean 'profile'?)" in errs
    assert any("[site_prometheus] max_in_flight: must be between 1 and 64" in e for e in errs)
    assert any("[site_prometheus.metrics.util] nmae: unknown key" in e for e in errs)
    # Cross-checks, once every key is well-formed:
    errs = errors_of('[site_prometheus]\nenabled = true\nhost_rewrite = "regex"\ntimeout_seconds = 30')
    assert "c.toml: [site_prometheus] url: must name the site Prometheus when enabled" in errs
    assert any("host_regex: must be" in e for e in errs)
    assert any("timeout_seconds: must be at most scrape_interval_seconds (15)" in e for e in errs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('url = "http://user:pw@prom:9090"', "url: must not carry credentials"),
        ('url = "http://prom:9090/?x=1"', "url: must not have a query"),
        ('ssh_host = "a b"', "ssh_host: must be a host name"),
        ('host_regex = ["("]', "host_regex: must be"),
        ('host_regex = ["(", "x"]', "host_regex: pattern is not a regular expression"),
        ('host_regex = ["(n.*)", "\\\\1.ib"]', 'host_regex: is only used with host_rewrite = "regex"'),
        ('profile = "nvidia"', "profile: must be one of 'dcgm', 'amd', 'generic'"),
        ('[site_prometheus.metrics.power]\nname = ""', "power: must map a metric"),
        (
            '[site_prometheus.metrics.power]\ngpu_label = "gpu-id"',
            "gpu_label: must be a Prometheus label name",
        ),
        ('[site_prometheus.metrics.gpu]\nname = "x"', "[site_prometheus.metrics.gpu]: unknown section"),
    ],
)
def test_bad_values(text: str, expected: str) -> None:
    head = "" if text.startswith("[") else "[site_prometheus]\n"
    assert any(expected in e for e in errors_of(head + text)), errors_of(head + text)


def test_auth_reads_the_secret_when_built_never_echoing_it(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cr3t\n")
    text = GOOD.replace(
        'profile = "amd"', f'profile = "amd"\nauth = "basic"\nusername = "jd"\nsecret_file = "{secret}"'
    )
    site = site_config(loads(text, source="c.toml"))
    assert site is not None and site.authorization == "Basic " + base64.b64encode(b"jd:s3cr3t").decode()
    assert "s3cr3t" not in repr(site)
    secret.write_text("")
    with pytest.raises(ConfigError, match=r"\[site_prometheus\] secret_file: the secret is missing or empty"):
        site_config(loads(text, source="c.toml"))
    errs = errors_of(GOOD.replace('profile = "amd"', 'profile = "amd"\nauth = "bearer"'))
    assert any("set exactly one of secret_file or secret_credential" in e for e in errs)
    ssh = errors_of(GOOD.replace('url = "http:', 'ssh_host = "login1"\nurl = "https:'))
    assert any("must be an http:// URL with ssh_host" in e for e in ssh)


def test_changes_need_a_restart_and_placement_reads_slurm() -> None:
    old = loads(GOOD, source="c.toml")
    new = loads(GOOD.replace('profile = "amd"', 'profile = "dcgm"'), source="c.toml")
    assert restart_required(old, new) == ["[site_prometheus] profile"]
    whole = loads(GOOD.replace("enabled = true", "enabled = true\nexclusive_nodes = true"))
    p = placement_for(whole, "42", "node[01-02]")
    assert p.nodes == ("node01", "node02") and p.exclusive
    detail = "Nodes=node01 CPU_IDs=0-3 Mem=0 GRES=gpu:4(IDX:4-7)"
    q = placement_for(old, "42", "node01", detail)
    assert not q.exclusive and q.gpus["node01"].indices == frozenset({4, 5, 6, 7})
