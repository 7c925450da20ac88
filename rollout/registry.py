"""Registry look-ups (reachable, tag exists, digest) and promotion by retag + push (same digest)."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from pipeline.errors import TargetError, UsageError

MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])
USER_ENV, PASSWORD_ENV = "ROLLOUT_REGISTRY_USER", "ROLLOUT_REGISTRY_PASSWORD"


@dataclass(frozen=True)
class ImageRef:
    registry: str
    name: str
    tag: str

    @property
    def repo(self) -> str:
        return f"{self.registry}/{self.name}"

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}"

    def with_tag(self, tag: str) -> ImageRef:
        return ImageRef(self.registry, self.name, tag)


def parse_image(ref: str) -> ImageRef:
    """REGISTRY/NAME:TAG with an explicit registry host and an explicit tag."""
    if not ref:
        raise UsageError("missing image: give IMAGE=<registry>/<name>:<tag>")
    if "@" in ref:
        raise UsageError(f"image '{ref}': give a tag, not a digest (the tag is what gets promoted)")
    first, _, rest = ref.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        raise UsageError(f"image '{ref}' has no registry host (expected e.g. 127.0.0.1:5000/name:tag)")
    name, sep, tag = rest.rpartition(":")
    if not sep or "/" in tag or not name:
        raise UsageError(f"image '{ref}' has no tag (expected <registry>/<name>:<tag>)")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise UsageError(f"image '{ref}': invalid tag '{tag}'")
    return ImageRef(first, name, tag)


def credentials(required: bool) -> tuple[str, str] | None:
    user, password = os.environ.get(USER_ENV, ""), os.environ.get(PASSWORD_ENV, "")
    if required and not (user and password):
        raise UsageError(
            f"registry credentials missing: set {USER_ENV} and {PASSWORD_ENV} (the registry needs a login)")
    return (user, password) if user and password else None


class Registry:
    def __init__(self, host: str, auth: tuple[str, str] | None = None, timeout_s: float = 10.0) -> None:
        self.host = host
        self.auth = auth
        self._http = httpx.Client(base_url=f"http://{host}", timeout=timeout_s, auth=auth)

    def close(self) -> None:
        self._http.close()

    def check(self) -> None:
        try:
            r = self._http.get("/v2/")
        except httpx.HTTPError as exc:
            raise TargetError(f"registry {self.host} unreachable ({type(exc).__name__}): nothing was changed") from None
        if r.status_code == 401:
            if self.auth is None:
                raise UsageError(
                    f"registry credentials missing: {self.host} needs a login; set {USER_ENV} and {PASSWORD_ENV}")
            raise UsageError(f"registry {self.host} rejected the credentials in {USER_ENV}/{PASSWORD_ENV}")
        if r.status_code != 200:
            raise TargetError(f"registry {self.host} answered HTTP {r.status_code} on /v2/")

    def digest(self, ref: ImageRef) -> str | None:
        try:
            r = self._http.head(f"/v2/{ref.name}/manifests/{ref.tag}", headers={"Accept": MANIFEST_TYPES})
        except httpx.HTTPError as exc:
            raise TargetError(f"registry {self.host} unreachable ({type(exc).__name__})") from None
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise TargetError(f"registry {self.host}: HTTP {r.status_code} for {ref}")
        return r.headers.get("Docker-Content-Digest")

    def require(self, ref: ImageRef) -> str:
        d = self.digest(ref)
        if d is None:
            raise UsageError(f"image tag not found in the registry: {ref} (push it first)")
        return d


def _docker():
    import docker

    return docker.from_env(timeout=300)


def promote(ref: ImageRef, promoted_tag: str, report_dir: Path, auth: tuple[str, str] | None,
            timeout_s: float = 10.0) -> dict:
    """Retag `ref` as `promoted_tag` and push it (same digest), then push the gate report beside it as
    `<name>:<tag>-gate-report` (a one-layer image holding the report files)."""
    reg = Registry(ref.registry, auth, timeout_s)
    try:
        reg.check()
        digest = reg.require(ref)
        client = _docker()
        auth_config = {"username": auth[0], "password": auth[1]} if auth else None
        client.images.pull(ref.repo, tag=ref.tag, auth_config=auth_config)
        image = client.images.get(str(ref))
        image.tag(ref.repo, promoted_tag)
        _push(client, ref.repo, promoted_tag, auth_config)
        promoted = ref.with_tag(promoted_tag)
        promoted_digest = reg.digest(promoted)
        if promoted_digest != digest:
            raise TargetError(f"promotion changed the digest: {ref} {digest} vs {promoted} {promoted_digest}")
        report_tag = f"{ref.tag}-gate-report"[:128]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for f in sorted(Path(report_dir).rglob("*")):
                if f.is_file():
                    tar.add(f, arcname=f"gate-report/{f.relative_to(report_dir)}")
            meta = json.dumps({"image": str(ref), "digest": digest, "promoted_as": str(promoted),
                               "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2).encode()
            info = tarfile.TarInfo("gate-report/promotion.json")
            info.size = len(meta)
            tar.addfile(info, io.BytesIO(meta))
        client.api.import_image_from_data(buf.getvalue(), repository=ref.repo, tag=report_tag)
        _push(client, ref.repo, report_tag, auth_config)
        return {"image": str(ref), "digest": digest, "promoted": str(promoted), "promoted_digest": promoted_digest,
                "gate_report_image": f"{ref.repo}:{report_tag}",
                "gate_report_digest": reg.digest(ref.with_tag(report_tag))}
    finally:
        reg.close()


def _push(client, repo: str, tag: str, auth_config: dict | None) -> None:
    for line in client.images.push(repo, tag=tag, stream=True, decode=True, auth_config=auth_config):
        if "error" in line:
            raise TargetError(f"push {repo}:{tag} failed: {line['error']}")
