"""A token server for the distribution token flow, for tests only: a registry started with `auth: token`
sends clients here (WWW-Authenticate: Bearer realm=...,service=...,scope=...); this server checks the Basic
login and answers a JWT (RS256, the signing certificate in the `x5c` header) granting the requested scope.
The registry trusts the certificate through its `rootcertbundle`.

    srv = TokenServer(dirpath, users={"alice": "pw"}); srv.start(); ...; srv.stop()
    srv.registry_config(addr, storage) -> the registry's YAML config (auth.token pointing here)
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

SERVICE = "fleet-token-registry"
ISSUER = "fleet-test-token-issuer"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, workdir: Path, users: dict[str, str], host: str = "127.0.0.1", port: int = 0) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.users = users
        self.requests: list[dict[str, str]] = []  # scope + user of each token handed out (never the password)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.bundle = self.dir / "token-ca.crt"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                q = parse_qs(urlparse(self.path).query)
                user = outer._login(self.headers.get("Authorization", ""))
                if user is None:
                    self.send_response(401)
                    self.end_headers()
                    return
                scopes = q.get("scope", [])
                body = json.dumps({"token": outer._token(user, scopes), "expires_in": 300}).encode()
                outer.requests.append({"user": user, "scope": " ".join(scopes)})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.realm = f"http://{host}:{self.httpd.server_address[1]}/token"
        self._thread: threading.Thread | None = None

    def _login(self, header: str) -> str | None:
        if not header.startswith("Basic "):
            return None
        try:
            user, _, pw = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None
        ok = user in self.users and secrets.compare_digest(self.users[user], pw)
        return user if ok else None

    def _token(self, user: str, scopes: list[str]) -> str:
        access = []
        for sc in scopes:
            kind, name, actions = sc.split(":", 2) if sc.count(":") >= 2 else ("repository", sc, "pull")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256",
                  "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        claims = {"iss": ISSUER, "sub": user, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(8), "access": access}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        sig = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(sig)}"

    def registry_config(self, addr: str, storage: Path) -> str:
        return (f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n"
                f"  delete:\n    enabled: true\nauth:\n  token:\n    realm: {self.realm}\n    service: {SERVICE}\n"
                f"    issuer: {ISSUER}\n    rootcertbundle: {self.bundle}\nhttp:\n  addr: {addr}\n")

    def start(self) -> TokenServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self._thread = None
