"""Image <-> fleet check against the real TLS + login registry: labels are read from the registry (config
blob only) and an image built for the other fleet, another sglang version or another patch series is
refused for the example inventory's host groups, with one line naming host and cause."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from sglfleet.flow import fit
from sglfleet.patches import load_series, series_dir_for
from sglfleet.pipeline.errors import UsageError
from sglfleet.rollout import registry as reglib
from sglfleet.rollout.inventory import load_inventory
from testbed.testbed import REGISTRY_CA, TEST_REGISTRY, registry_env, registry_login

pytestmark = [pytest.mark.docker, pytest.mark.integration]
SERIES = load_series(series_dir_for("0.5.23")).sha256


def _tiny_image(client, ref: str, labels: dict[str, str]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = json.dumps(labels).encode()
        info = tarfile.TarInfo("labels.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    repo, _, tag = ref.rpartition(":")
    changes = [f'LABEL {k}="{v}"' for k, v in labels.items()]
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag, changes=changes)
    for line in client.images.push(repo, tag=tag, stream=True, decode=True, auth_config=registry_login()):
        assert "error" not in line, line


@pytest.fixture(scope="module")
def reg(services):
    env = registry_env()
    creds = reglib.Credentials(env["ROLLOUT_REGISTRY_USER"], env["ROLLOUT_REGISTRY_PASSWORD"])
    r = reglib.Registry(TEST_REGISTRY, creds, reglib.Transport(tls=True, ca_bundle=str(REGISTRY_CA)))
    r.check()
    yield r
    r.close()


def _labels(target: str, arch: str, version: str = "0.5.23", series: str = SERIES) -> dict[str, str]:
    return {"org.fleet.target": target, "org.fleet.cuda.arch": arch, "org.sglang.version": version,
            "org.fleet.patch-series.sha256": series}


CASES = {
    "pcie-ok": (_labels("pcie", "12.0f"), "pcie", None),
    "nvlink-ok": (_labels("nvlink", "10.3a 10.0a"), "nvlink", None),
    "nvlink-image-on-pcie": (_labels("nvlink", "10.3a 10.0a"), "pcie", "built for nvlink, the host group is pcie"),
    "pcie-image-on-nvlink": (_labels("pcie", "12.0f"), "nvlink", "built for pcie, the host group is nvlink"),
    "other-sglang": (_labels("pcie", "12.0f", version="0.5.17"), "pcie", "sglang 0.5.17, the fleet runs 0.5.23"),
    "other-series": (_labels("pcie", "12.0f", series="0" * 64), "pcie", "patch series 000000000000"),
    "unlabelled": ({}, "pcie", "has no org.fleet.target label"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fit_from_registry_labels(case, reg, services):
    labels, group, expect = CASES[case]
    ref = f"{TEST_REGISTRY}/fit-test:{case}"
    _tiny_image(services, ref, labels)
    got = reg.labels(reglib.parse_image(ref))
    assert {k: v for k, v in got.items() if k.startswith("org.")} == labels
    inv = load_inventory("ansible/inventories/example")
    hosts = sorted(inv.groups[group])
    if expect is None:
        assert fit.check(ref, got, inv, hosts)["ok"]
    else:
        with pytest.raises(UsageError) as ei:
            fit.check(ref, got, inv, hosts)
        assert expect in str(ei.value) and hosts[0] in str(ei.value) and "nothing was changed" in str(ei.value)
