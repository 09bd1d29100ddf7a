"""Starts a real `arbor serve` process on loopback for the client tests (openai, grpcio, raw
HTTP) and stops it. Environment: ARBOR_BIN (the arbor executable), ARBOR_SHARED_DIR (../shared).
"""
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import time
import urllib.request

ARBOR_BIN = os.environ.get("ARBOR_BIN", "build/server/arbor")
SHARED = os.environ.get("ARBOR_SHARED_DIR", "../shared")
STORIES = os.path.join(SHARED, "models", "stories260K", "stories260K.bin")


def _die_with_parent():
    """The server gets SIGTERM if the test process dies (no stray servers after a crash)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ArborServer:
    """`with ArborServer(extra_args) as srv:` -> srv.base_url, srv.port, srv.grpc_port."""

    def __init__(self, args=(), model=STORIES, grpc=True, env=None):
        self.port = free_port()
        self.grpc_port = free_port() if grpc else 0
        self.model = model
        self.args = list(args)
        self.env = env
        self.proc = None
        self.log_path = None

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout=120):
        cmd = [ARBOR_BIN, "serve", "--model", self.model, "--port", str(self.port),
               "--grpc-port", str(self.grpc_port)] + self.args
        self.log_path = f"/tmp/arbor_serve_{self.port}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        env.update(self.env or {})
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=1) as r:
                    # /health answers once HTTP is up; the start-up messages (the listening
                    # lines, the bind warning) are flushed after gRPC starts, a moment later.
                    if r.status == 200 and "HTTP listening" in self.output():
                        return self
            except Exception:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become healthy:\n" + self.output())

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def metrics(self):
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, v = line.rpartition(" ")
                values[name] = float(v)
        return values


def tok512_pieces():
    """stories260K's vocabulary as llama2.c's tokenizer file stores it (spaces, not U+2581)."""
    with open(os.path.join(SHARED, "models", "stories260K", "tok512.bin"), "rb") as f:
        data = f.read()
    off = 4
    vocab = []
    for _ in range(512):
        off += 4  # score
        (n,) = struct.unpack_from("<i", data, off)
        off += 4
        vocab.append(data[off:off + n])
        off += n
    return vocab


def raw(port, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or text) over a fresh connection; a dict or list body is sent as
    JSON, every request with a JSON content type (plus `headers`)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn.request(method, path, body=body,
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read().decode("utf-8", errors="replace")
    conn.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data
