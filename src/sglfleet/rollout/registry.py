"""Registry access through oras-py (OCI distribution client): reachability, digests, the image config
(labels), promotion as a registry-side manifest retag, and evidence attached to the promoted digest.

TLS is the default (`verify` = a CA bundle path, or the system store); plain HTTP only where the
deployment says so (a loopback test registry). Auth: Basic or the distribution token flow, picked from
the registry's own `WWW-Authenticate` challenge; credentials come from ROLLOUT_REGISTRY_USER /
ROLLOUT_REGISTRY_PASSWORD or, failing those, the Docker config file ($DOCKER_CONFIG/config.json or
~/.docker/config.json). No credential is ever put into a message, a report or a log line.

Promotion never moves layers: the tagged manifest's bytes are read (a few KiB) and PUT again under the
promoted tag, and the registry must answer with the same digest.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglfleet.pipeline.errors import TargetError, UsageError
from sglfleet.rollout import retry

MANIFEST_TYPES = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
]
INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
EVIDENCE_TYPE = "application/vnd.sglang-fleet.evidence.v1"
EVIDENCE_LAYER = "application/vnd.sglang-fleet.evidence.v1.tar+gzip"
USER_ENV, PASSWORD_ENV = "ROLLOUT_REGISTRY_USER", "ROLLOUT_REGISTRY_PASSWORD"
CA_ENV = "ROLLOUT_REGISTRY_CA_BUNDLE"


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


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = "environment"

    def __str__(self) -> str:  # never the password
        return f"{self.username} (from {self.source})"


def _docker_config_creds(host: str) -> Credentials | None:
    cfg_dir = os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker")
    path = Path(cfg_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        auths = json.loads(path.read_text()).get("auths", {})
    except (OSError, ValueError):
        raise UsageError(f"docker config {path} is not valid JSON") from None
    for key in (host, f"https://{host}", f"http://{host}"):
        entry = auths.get(key) or {}
        if entry.get("auth"):
            try:
                user, _, pw = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise UsageError(f"docker config {path}: the auth entry for {host} is not base64 "
                                 "user:password") from None
            if user and pw:
                return Credentials(user, pw, f"docker config {path}")
    return None


def credentials(host: str, required: bool) -> Credentials | None:
    """The login for `host`: the environment first, then the Docker config file."""
    user, password = os.environ.get(USER_ENV, ""), os.environ.get(PASSWORD_ENV, "")
    if user and password:
        return Credentials(user, password)
    found = _docker_config_creds(host)
    if required and found is None:
        raise UsageError(f"registry credentials missing: set {USER_ENV} and {PASSWORD_ENV} or log in "
                         f"(docker login {host}); the registry needs a login")
    return found


def _transient(exc: BaseException) -> bool:
    """No connection or no answer in time (a TLS failure is not transient: it is a configuration error)."""
    import requests

    return (isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)
            and not isinstance(exc, requests.exceptions.SSLError))


@dataclass(frozen=True)
class Transport:
    """How to talk to a registry: TLS (with an optional CA bundle) or, loopback test registries only, HTTP."""

    tls: bool = True
    ca_bundle: str | None = None
    timeout_s: float = 10.0

    @property
    def verify(self) -> bool | str:
        return self.ca_bundle or True


class Registry:
    """One registry, one oras-py provider; `check()` first (it picks the auth flow from the challenge)."""

    def __init__(self, host: str, creds: Credentials | None = None, transport: Transport | None = None, *,
                 retry_policy: retry.Policy | None = None, retry_log: retry.RetryLog | None = None) -> None:
        self.host = host
        # Transient failures (no connection, a timeout, 429 / 5xx) are retried with back-off, each retry logged.
        self.retry_policy = retry_policy or retry.Policy()
        self.retry_log = retry_log if retry_log is not None else retry.RetryLog()
        self.creds = creds
        self.t = transport or Transport()
        if self.t.ca_bundle and not Path(self.t.ca_bundle).is_file():
            raise UsageError(f"registry CA bundle not found: {self.t.ca_bundle}")
        self.scheme = "https" if self.t.tls else "http"
        self.auth_scheme: str | None = None  # "basic" / "bearer" once check() saw the registry ask for a login
        self._oras: Any = None

    # ------------------------------------------------------------------ connection + auth
    def _provider(self, backend: str) -> Any:
        import oras.provider

        reg = oras.provider.Registry(hostname=self.host, insecure=not self.t.tls, tls_verify=self.t.verify,
                                     auth_backend=backend)
        # oras-py sends every request without a timeout: bound them all.
        reg.session.request = functools.partial(reg.session.request, timeout=self.t.timeout_s)
        if self.creds:
            reg.auth.set_basic_auth(self.creds.username, self.creds.password)
        return reg

    def close(self) -> None:
        if self._oras is not None:
            self._oras.session.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self) -> None:
        """GET /v2/ and authenticate: every failure is one clear error naming its cause; changes nothing."""
        import requests

        url = f"{self.scheme}://{self.host}/v2/"
        probe = self._provider("basic")
        probe.session.headers.pop("Authorization", None)
        try:
            r = retry.call(lambda: probe.session.get(url, verify=self.t.verify, timeout=self.t.timeout_s),
                           what="registry", name=f"GET {self.host}/v2/", policy=self.retry_policy,
                           log=self.retry_log, retry_exc=_transient, retry_result=retry.http_status_reason)
        except requests.exceptions.SSLError as exc:
            text = str(exc.args[0] if exc.args else exc)
            m = re.search(r"\] ([^\]]*?) \(_ssl", text)
            why = (m.group(1) if m else re.sub(r"\s+", " ", text))[:200]
            raise TargetError(f"registry {self.host}: TLS error ({why}); give the registry's CA with {CA_ENV} "
                              f"or rollout registry_ca_bundle: nothing was changed") from None
        except requests.exceptions.RequestException as exc:
            raise TargetError(f"registry {self.host} unreachable ({type(exc).__name__}): nothing was changed") from None
        finally:
            probe.session.close()
        if r.status_code == 200:
            self._oras = self._provider("basic" if self.creds else "token")
            return
        if r.status_code != 401:
            raise TargetError(f"registry {self.host} answered HTTP {r.status_code} on /v2/: nothing was changed")
        challenge = r.headers.get("WWW-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        self.auth_scheme = scheme
        if self.creds is None:
            raise UsageError(f"registry credentials missing: {self.host} needs a login ({scheme or 'unknown'} auth); "
                             f"set {USER_ENV} and {PASSWORD_ENV} or log in with docker login")
        if scheme == "basic":
            self._oras = self._provider("basic")
            r2 = self._oras.session.get(url, headers=self._oras.auth.get_auth_header(), verify=self.t.verify)
            if r2.status_code != 200:
                raise UsageError(f"registry {self.host} rejected the credentials of {self.creds.username} "
                                 f"(HTTP {r2.status_code}, Basic auth)")
            self._oras.session.headers.update(self._oras.auth.get_auth_header())
            return
        if scheme == "bearer":
            import oras.auth.utils

            self._oras = self._provider("token")
            h = oras.auth.utils.parse_auth_header(challenge)
            if not h.realm:
                raise TargetError(f"registry {self.host}: token challenge without a realm: {challenge[:200]}")
            try:
                token = self._oras.auth.request_token(h)
            except requests.exceptions.RequestException as exc:
                raise TargetError(f"registry {self.host}: token server {h.realm} unreachable "
                                  f"({type(exc).__name__})") from None
            if not token:
                raise UsageError(f"registry {self.host}: the token server {h.realm} refused the credentials of "
                                 f"{self.creds.username}")
            self._oras.auth.token = None  # scopes differ per repository: each request gets its own token
            return
        raise TargetError(f"registry {self.host}: unsupported auth challenge '{challenge[:80]}'")

    def _req(self, method: str, path: str, **kw: Any) -> Any:
        if self._oras is None:
            self.check()
        import requests

        if hasattr(self._oras.auth, "token"):
            self._oras.auth.token = None  # token flow: a fresh token for this request's scope
        url = path if path.startswith("http") else f"{self.scheme}://{self.host}{path}"
        try:
            return retry.call(lambda: self._oras.do_request(url, method, **kw), what="registry",
                              name=f"{method} {self.host}{path.split('?')[0] if path.startswith('/') else path}",
                              policy=self.retry_policy, log=self.retry_log, retry_exc=_transient,
                              retry_result=retry.http_status_reason)
        except requests.exceptions.RequestException as exc:
            raise TargetError(f"registry {self.host} unreachable ({type(exc).__name__})") from None
        except ValueError as exc:  # oras: "Cannot respond to request for authentication."
            raise UsageError(f"registry {self.host}: authentication failed for {method} {path} ({exc})") from None

    # ------------------------------------------------------------------ reads
    def manifest(self, ref: ImageRef | str, name: str | None = None) -> tuple[bytes, str, str] | None:
        """(raw bytes, media type, digest) of a tag or digest, or None when it does not exist."""
        if isinstance(ref, ImageRef):
            name, tag = ref.name, ref.tag
        else:
            tag = ref
        r = self._req("GET", f"/v2/{name}/manifests/{tag}", headers={"Accept": ", ".join(MANIFEST_TYPES)})
        if r.status_code == 404:
            return None
        if r.status_code in (401, 403):
            raise UsageError(f"registry {self.host}: access to {name} denied (HTTP {r.status_code})")
        if r.status_code != 200:
            raise TargetError(f"registry {self.host}: HTTP {r.status_code} for {name}:{tag}")
        raw = r.content
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        header = r.headers.get("Docker-Content-Digest")
        if header and header != digest:
            raise TargetError(f"registry {self.host}: manifest of {name}:{tag} does not match its digest header")
        mt = r.headers.get("Content-Type", "").split(";")[0] or json.loads(raw).get("mediaType", "")
        return raw, mt, digest

    def digest(self, ref: ImageRef) -> str | None:
        m = self.manifest(ref)
        return m[2] if m else None

    def require(self, ref: ImageRef) -> str:
        d = self.digest(ref)
        if d is None:
            raise UsageError(f"image tag not found in the registry: {ref} (push it first)")
        return d

    def image_config(self, ref: ImageRef) -> dict[str, Any]:
        """The image's config JSON (labels under config.Labels), read from the registry (no layers)."""
        m = self.manifest(ref)
        if m is None:
            raise UsageError(f"image tag not found in the registry: {ref} (push it first)")
        raw, mt, _ = m
        doc = json.loads(raw)
        if mt in INDEX_TYPES or "manifests" in doc:
            entries = doc.get("manifests", [])
            pick = next((e for e in entries if (e.get("platform") or {}).get("architecture") == "amd64"),
                        entries[0] if entries else None)
            if pick is None:
                raise UsageError(f"{ref}: empty image index")
            sub = self.manifest(pick["digest"], name=ref.name)
            if sub is None:
                raise TargetError(f"{ref}: index entry {pick['digest']} missing")
            doc = json.loads(sub[0])
        cfg_digest = (doc.get("config") or {}).get("digest")
        if not cfg_digest:
            raise UsageError(f"{ref}: manifest has no config")
        r = self._req("GET", f"/v2/{ref.name}/blobs/{cfg_digest}")
        if r.status_code != 200:
            raise TargetError(f"registry {self.host}: config blob of {ref}: HTTP {r.status_code}")
        return json.loads(r.content)

    def labels(self, ref: ImageRef) -> dict[str, str]:
        cfg = self.image_config(ref)
        return dict((cfg.get("config") or {}).get("Labels") or {})

    # ------------------------------------------------------------------ writes
    def put_manifest(self, name: str, tag: str, raw: bytes, media_type: str) -> str:
        r = self._req("PUT", f"/v2/{name}/manifests/{tag}", data=raw, headers={"Content-Type": media_type})
        if r.status_code not in (200, 201):
            raise TargetError(f"registry {self.host}: PUT manifest {name}:{tag} failed: HTTP {r.status_code} "
                              f"{r.text[:200]}")
        return r.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(raw).hexdigest()

    def put_blob(self, name: str, data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        head = self._req("HEAD", f"/v2/{name}/blobs/{digest}")
        if head.status_code != 200:
            start = self._req("POST", f"/v2/{name}/blobs/uploads/")
            if start.status_code != 202:
                raise TargetError(f"registry {self.host}: blob upload to {name} refused: HTTP {start.status_code}")
            loc = start.headers["Location"]
            if loc.startswith("/"):
                loc = f"{self.scheme}://{self.host}{loc}"
            sep = "&" if "?" in loc else "?"
            r = self._req("PUT", f"{loc}{sep}digest={digest}", data=data,
                          headers={"Content-Type": "application/octet-stream"})
            if r.status_code != 201:
                raise TargetError(f"registry {self.host}: blob upload to {name} failed: HTTP {r.status_code}")
        return {"digest": digest, "size": len(data)}


def retag(reg: Registry, ref: ImageRef, new_tag: str, expect_digest: str) -> str:
    """Registry-side retag: the manifest's bytes under `new_tag`; the registry must keep the digest."""
    m = reg.manifest(ref)
    if m is None:
        raise UsageError(f"image tag not found in the registry: {ref}")
    raw, mt, digest = m
    if digest != expect_digest:
        raise TargetError(f"{ref} moved during the rollout: deployed {expect_digest}, the tag now points at {digest}; "
                          "not promoting")
    got = reg.put_manifest(ref.name, new_tag, raw, mt)
    after = reg.digest(ref.with_tag(new_tag))
    if got != digest or after != digest:
        raise TargetError(f"promotion changed the digest: {ref} {digest} vs {ref.with_tag(new_tag)} {after}")
    return digest


def _tar_gz(files: dict[str, Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for arc, path in sorted(files.items()):
            info = tar.gettarinfo(str(path), arcname=arc)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def attach_evidence(reg: Registry, ref: ImageRef, subject_digest: str, subject_media_type: str, subject_size: int,
                    evidence_dirs: dict[str, Path], annotations: dict[str, str]) -> dict[str, Any]:
    """An OCI artifact (gate + load-test reports) whose `subject` is the promoted manifest, pushed by digest
    and tagged `<tag>-evidence`; the referrers tag schema index (`sha256-<hex>`) lists it for registries
    without the referrers API (distribution 2.8)."""
    files: dict[str, Path] = {}
    for prefix, d in evidence_dirs.items():
        for f in sorted(Path(d).rglob("*")):
            if f.is_file() and f.stat().st_size < 20_000_000:
                files[f"{prefix}/{f.relative_to(d)}"] = f
    layer = reg.put_blob(ref.name, _tar_gz(files))
    empty = reg.put_blob(ref.name, b"{}")
    ann = {"org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **annotations}
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": EVIDENCE_TYPE,
        "config": {"mediaType": EMPTY_CONFIG, **empty},
        "layers": [{"mediaType": EVIDENCE_LAYER, **layer,
                    "annotations": {"org.opencontainers.image.title": "evidence.tar.gz"}}],
        "subject": {"mediaType": subject_media_type, "digest": subject_digest, "size": subject_size},
        "annotations": ann,
    }
    raw = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    digest = reg.put_manifest(ref.name, "sha256:" + hashlib.sha256(raw).hexdigest(), raw, OCI_MANIFEST)
    tag = f"{ref.tag}-evidence"[:128]
    reg.put_manifest(ref.name, tag, raw, OCI_MANIFEST)
    # Referrers tag schema: an index under sha256-<hex of the subject> listing every referrer.
    fallback = "sha256-" + subject_digest.split(":", 1)[1]
    prev = reg.manifest(fallback, name=ref.name)
    entries = json.loads(prev[0]).get("manifests", []) if prev else []
    entries = [e for e in entries if e.get("digest") != digest]
    entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw), "artifactType": EVIDENCE_TYPE,
                    "annotations": ann})
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries},
                       separators=(",", ":")).encode()
    reg.put_manifest(ref.name, fallback, index, OCI_INDEX)
    return {"evidence_digest": digest, "evidence_tag": f"{ref.repo}:{tag}", "referrers_tag": f"{ref.repo}:{fallback}",
            "files": len(files)}


def promote(reg: Registry, ref: ImageRef, promoted_tag: str, digest: str, evidence_dirs: dict[str, Path],
            annotations: dict[str, str]) -> dict[str, Any]:
    """Retag `ref` (checked to still be `digest`) as `promoted_tag`, then attach the evidence to the digest."""
    m = reg.manifest(ref)
    if m is None:
        raise UsageError(f"image tag not found in the registry: {ref}")
    retag(reg, ref, promoted_tag, digest)
    ev = attach_evidence(reg, ref, digest, m[1], len(m[0]), evidence_dirs, annotations)
    return {"image": str(ref), "digest": digest, "promoted": str(ref.with_tag(promoted_tag)),
            "promoted_digest": digest, "layers_moved": 0, **ev}
