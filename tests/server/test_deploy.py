"""What deployment relies on (docs/deploy.md), with real `arbor serve` processes on stories260K:
the API key from ARBOR_API_KEY or a key file (--api-key-file, server.api_key_file) and its
precedence (config file < environment < flags), the errors of a bad key file, the warning when
the server listens beyond loopback without a key, the config from ARBOR_CONFIG, the container
configs (deploy/container-*.yaml) read by the server; and the deployment files themselves
(Dockerfile, deploy/compose.yaml, deploy/prometheus.yml, deploy/k8s/*.yaml) parsed and checked
against each other and against the metrics the server exports. The image itself is tested by
scripts/test_image.sh.

Run: ARBOR_BIN=build/server/arbor ARBOR_SHARED_DIR=../shared python3 tests/server/test_deploy.py
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import openai
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ARBOR_BIN, STORIES, ArborServer, raw  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(REPO, "deploy")
MODEL = "stories260K.bin"
WARNING = "without an API key"


def clean_env(**extra):
    """The test's environment without the variables under test, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("ARBOR_API_KEY", "ARBOR_CONFIG")}
    env.update(extra)
    return env


def write(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    return path


class ApiKeySources(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def assert_key(self, srv, key, not_keys=()):
        """`key` opens /v1/*, every key in `not_keys` gets 401; /health stays open."""
        # Clients are closed: an idle keep-alive connection holds the server's exit up to 5 s.
        for wrong in not_keys:
            with openai.OpenAI(base_url=srv.base_url + "/v1", api_key=wrong, max_retries=0) as c:
                with self.assertRaises(openai.AuthenticationError, msg=wrong):
                    c.completions.create(model=MODEL, prompt="x", max_tokens=2)
        with openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0) as c:
            self.assertEqual(c.completions.create(model=MODEL, prompt="x",
                                                  max_tokens=2).usage.completion_tokens, 2)
        self.assertEqual(raw(srv.port, "GET", "/health")[0], 200)
        self.assertIn("api_key: <set>", srv.output())

    def test_key_from_environment(self):
        with ArborServer([], grpc=False, env=clean_env(ARBOR_API_KEY="env-key")) as srv:
            self.assert_key(srv, "env-key", not_keys=("wrong",))
            self.assertEqual(raw(srv.port, "POST", "/v1/completions", {"prompt": "x"})[0], 401)

    def test_key_file_without_its_trailing_newline(self):
        path = write(self.dir, "key", "file-key\n")
        with ArborServer(["--api-key-file", path], grpc=False, env=clean_env()) as srv:
            self.assert_key(srv, "file-key", not_keys=("file-ke", "wrong"))
            self.assertIn(f"api_key_file: {path}", srv.output())

    def test_grpc_takes_the_same_key(self):
        import grpc
        path = write(self.dir, "key", "grpc-key")
        with ArborServer(["--api-key-file", path], env=clean_env()) as srv, \
                grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
            info = ch.unary_unary("/arbor.v1.Arbor/GetModelInfo",
                                  request_serializer=lambda _: b"",
                                  response_deserializer=lambda b: b)
            with self.assertRaises(grpc.RpcError) as e:
                info(None, timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn(MODEL.encode(), info(None, timeout=30,
                                               metadata=(("authorization", "Bearer grpc-key"),)))

    def test_precedence_config_then_environment_then_flags(self):
        key_file = write(self.dir, "key", "file-key")
        config = write(self.dir, "c.yaml", "server:\n  api_key: config-key\n")
        # The environment replaces the config file's key...
        with ArborServer(["--config", config], grpc=False,
                         env=clean_env(ARBOR_API_KEY="env-key")) as srv:
            self.assert_key(srv, "env-key", not_keys=("config-key",))
        # ...and a flag replaces both, a key file as well as a key.
        with ArborServer(["--config", config, "--api-key-file", key_file], grpc=False,
                         env=clean_env(ARBOR_API_KEY="env-key")) as srv:
            self.assert_key(srv, "file-key", not_keys=("config-key", "env-key"))
        with ArborServer(["--api-key", "flag-key"], grpc=False,
                         env=clean_env(ARBOR_API_KEY="env-key")) as srv:
            self.assert_key(srv, "flag-key", not_keys=("env-key",))
        # A config file's key file, replaced by the environment's key.
        config_file = write(self.dir, "f.yaml", f"server:\n  api_key_file: {key_file}\n")
        with ArborServer(["--config", config_file], grpc=False, env=clean_env()) as srv:
            self.assert_key(srv, "file-key", not_keys=("env-key",))
        with ArborServer(["--config", config_file], grpc=False,
                         env=clean_env(ARBOR_API_KEY="env-key")) as srv:
            self.assert_key(srv, "env-key", not_keys=("file-key",))

    def refused(self, args, env=None):
        r = subprocess.run([ARBOR_BIN, "serve", "--model", STORIES, "--port", "0",
                            "--grpc-port", "0"] + args, capture_output=True, text=True,
                           timeout=60, env=env or clean_env())
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("listening", r.stdout)
        return r.stdout + r.stderr

    def test_bad_key_files_are_refused(self):
        missing = os.path.join(self.dir, "missing")
        self.assertIn(f"server.api_key_file: cannot open '{missing}'",
                      self.refused(["--api-key-file", missing]))
        blank = write(self.dir, "blank", " \n\n")
        self.assertIn(f"server.api_key_file: '{blank}' holds no key",
                      self.refused(["--api-key-file", blank]))
        self.assertIn("--api-key excludes --api-key-file",
                      self.refused(["--api-key", "k", "--api-key-file", blank]))
        both = write(self.dir, "both.yaml", f"server:\n  api_key: k\n  api_key_file: {blank}\n")
        self.assertIn("server.api_key_file: '%s' given beside server.api_key" % blank,
                      self.refused(["--config", both]))


class BindWarning(unittest.TestCase):
    def test_warns_beyond_loopback_without_a_key(self):
        with ArborServer(["--host", "0.0.0.0"], env=clean_env()) as srv:
            self.assertEqual(raw(srv.port, "GET", "/health")[0], 200)
            log = srv.output()
        line = next(l for l in log.splitlines() if WARNING in l)
        self.assertIn("[warning] listening on 0.0.0.0 without an API key", line)
        self.assertIn("ARBOR_API_KEY", line)

    def test_no_warning_with_a_key_or_on_loopback(self):
        with ArborServer(["--host", "0.0.0.0"], env=clean_env(ARBOR_API_KEY="k")) as srv:
            self.assertNotIn(WARNING, srv.output())
        for host in ("127.0.0.1", "localhost"):
            with ArborServer(["--host", host], env=clean_env()) as srv:
                self.assertIn("listening", srv.output())
                self.assertNotIn(WARNING, srv.output())


class ConfigFromEnvironment(unittest.TestCase):
    def test_arbor_config_when_no_config_flag(self):
        with tempfile.TemporaryDirectory() as d:
            env_cfg = write(d, "env.yaml", f"model:\n  path: {STORIES}\n  name: from-env\n")
            flag_cfg = write(d, "flag.yaml", f"model:\n  path: {STORIES}\n  name: from-flag\n")
            with ArborServer([], grpc=False, env=clean_env(ARBOR_CONFIG=env_cfg)) as srv:
                self.assertEqual(raw(srv.port, "GET", "/v1/models")[1]["data"][0]["id"],
                                 "from-env")
            with ArborServer(["--config", flag_cfg], grpc=False,
                             env=clean_env(ARBOR_CONFIG=env_cfg)) as srv:
                self.assertEqual(raw(srv.port, "GET", "/v1/models")[1]["data"][0]["id"],
                                 "from-flag")

    def test_container_cpu_config_serves(self):
        """The CPU image's config as the image uses it (ARBOR_CONFIG, the model by flag):
        0.0.0.0 with the key from the environment, no warning."""
        cfg = os.path.join(DEPLOY, "container-cpu.yaml")
        with ArborServer([], env=clean_env(ARBOR_CONFIG=cfg, ARBOR_API_KEY="k")) as srv:
            log = srv.output()
            self.assertIn("host: 0.0.0.0", log)
            self.assertIn("backend: cpu", log)
            self.assertNotIn(WARNING, log)
            self.assertEqual(raw(srv.port, "GET", "/v1/models",
                                 headers={"Authorization": "Bearer k"})[0], 200)


def load_all(name):
    with open(os.path.join(DEPLOY, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


class DeployFiles(unittest.TestCase):
    """Every YAML file under deploy/ parses, and the files agree with each other, with the
    Dockerfile and with the server."""

    @classmethod
    def setUpClass(cls):
        cls.docs = {}
        for base, _, files in os.walk(DEPLOY):
            for f in files:
                if f.endswith((".yaml", ".yml")):
                    rel = os.path.relpath(os.path.join(base, f), DEPLOY)
                    cls.docs[rel] = load_all(rel)
        cls.k8s = {(d["kind"], d["metadata"]["name"]): d
                   for rel, docs in cls.docs.items() if rel.startswith("k8s/") for d in docs
                   if "kind" in d and "metadata" in d}
        with open(os.path.join(REPO, "Dockerfile")) as f:
            cls.dockerfile = f.read()

    def test_all_files_parse(self):
        for name in ("compose.yaml", "prometheus.yml", "container-cpu.yaml",
                     "container-cuda.yaml", "k8s/deployment.yaml", "k8s/service.yaml",
                     "k8s/hpa.yaml", "k8s/monitoring.yaml", "k8s/kustomization.yaml"):
            self.assertIn(name, self.docs)
            self.assertTrue(self.docs[name], name)
        kustomize = self.docs["k8s/kustomization.yaml"][0]
        self.assertEqual(sorted(kustomize["resources"]),
                         sorted(n[4:] for n in self.docs if n.startswith("k8s/") and
                                n != "k8s/kustomization.yaml"))

    def test_dockerfile(self):
        d = self.dockerfile
        self.assertRegex(d, r"(?m)^ARG BASE=$")
        self.assertIn("FROM ${BUILD_BASE} AS build", d)
        self.assertIn("FROM ${RUNTIME_BASE} AS runtime", d)
        self.assertIn("--target arbor", d)
        self.assertRegex(d, r"(?m)^EXPOSE 8000 50051$")
        self.assertRegex(d, r"(?m)^USER 10001:10001$")
        self.assertRegex(d, r"(?m)^ENTRYPOINT \[\"arbor\", \"serve\"\]$")
        self.assertRegex(d, r"(?ms)^HEALTHCHECK .*/dev/tcp/127\.0\.0\.1/8000.*GET /health ")
        self.assertIn("ENV ARBOR_CONFIG=/etc/arbor/arbor.yaml", d)
        # Every path the build copies is in the build context (.dockerignore keeps it out
        # otherwise).
        with open(os.path.join(REPO, ".dockerignore")) as f:
            ignored = [l.strip().rstrip("/") for l in f if l.strip() and not l.startswith("#")]
        for src in re.findall(r"(?m)^COPY (?!--from)(.+) \S+$", d):
            for path in src.split():
                self.assertTrue(os.path.exists(os.path.join(REPO, path)), path)
                self.assertFalse(any(path == i or path.startswith(i + "/") for i in ignored),
                                 path)

    def test_container_configs_match_the_image(self):
        for variant in ("cpu", "cuda"):
            cfg = self.docs[f"container-{variant}.yaml"][0]
            self.assertEqual(cfg["model"]["backend"], variant)
            self.assertEqual(cfg["server"]["host"], "0.0.0.0")
            self.assertEqual((cfg["server"]["port"], cfg["server"]["grpc_port"]), (8000, 50051))
            self.assertNotIn("api_key", cfg["server"])
            self.assertTrue(cfg["model"]["path"].startswith("/models/"))

    def test_compose_and_prometheus(self):
        compose = self.docs["compose.yaml"][0]
        arbor = compose["services"]["arbor"]
        self.assertIn("8000:8000", arbor["ports"])
        self.assertIn("50051:50051", arbor["ports"])
        self.assertIn("./models:/models:ro", arbor["volumes"])
        self.assertEqual(arbor["command"][-2:], ["--api-key-file", "/run/secrets/arbor_api_key"])
        self.assertIn("arbor_api_key", compose["secrets"])
        grace = int(arbor["stop_grace_period"].rstrip("s"))
        self.assertGreater(grace, self.docs["container-cuda.yaml"][0]["server"]["drain_timeout_s"])
        devices = arbor["deploy"]["resources"]["reservations"]["devices"]
        self.assertEqual(devices[0]["capabilities"], ["gpu"])
        prom = compose["services"]["prometheus"]
        self.assertIn("./prometheus.yml:/etc/prometheus/prometheus.yml:ro", prom["volumes"])
        job = self.docs["prometheus.yml"][0]["scrape_configs"][0]
        self.assertEqual(job["metrics_path"], "/metrics")
        self.assertEqual(job["static_configs"][0]["targets"], ["arbor:8000"])

    def test_kubernetes_manifests(self):
        dep = self.k8s[("Deployment", "arbor")]
        pod = dep["spec"]["template"]
        labels = pod["metadata"]["labels"]
        self.assertEqual(dep["spec"]["selector"]["matchLabels"], labels)
        (c,) = pod["spec"]["containers"]
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 1)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"http": 8000, "grpc": 50051})
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["httpGet"], {"path": "/health", "port": "http"}, probe)
        drain = self.docs["container-cuda.yaml"][0]["server"]["drain_timeout_s"]
        live = c["livenessProbe"]
        self.assertGreater(live["periodSeconds"] * live["failureThreshold"], drain)
        self.assertGreater(pod["spec"]["terminationGracePeriodSeconds"], drain + 5)
        self.assertEqual(pod["spec"]["securityContext"]["runAsUser"], 10001)
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        self.assertEqual(mounts["models"], "/models")
        key_file = c["args"][c["args"].index("--api-key-file") + 1]
        self.assertEqual(os.path.dirname(key_file), mounts["api-key"])
        for name in ("arbor", "arbor-headless"):
            svc = self.k8s[("Service", name)]
            self.assertEqual(svc["spec"]["selector"], labels)
            for p in svc["spec"]["ports"]:
                self.assertIn(p["targetPort"], ports)
        self.assertEqual(self.k8s[("Service", "arbor-headless")]["spec"]["clusterIP"], "None")
        monitor = self.k8s[("PodMonitor", "arbor")]
        self.assertEqual(monitor["spec"]["selector"]["matchLabels"], labels)
        self.assertEqual(monitor["spec"]["podMetricsEndpoints"][0]["path"], "/metrics")

    def test_autoscaler_metric_is_exported_and_served_by_the_adapter(self):
        hpa = self.k8s[("HorizontalPodAutoscaler", "arbor")]
        self.assertEqual(hpa["apiVersion"], "autoscaling/v2")
        self.assertEqual(hpa["spec"]["scaleTargetRef"],
                         {"apiVersion": "apps/v1", "kind": "Deployment", "name": "arbor"})
        (metric,) = hpa["spec"]["metrics"]
        self.assertEqual(metric["type"], "Pods")
        name = metric["pods"]["metric"]["name"]
        rules = yaml.safe_load(self.k8s[("ConfigMap", "adapter-config")]["data"]["config.yaml"])
        (rule,) = rules["rules"]
        self.assertTrue(rule["seriesQuery"].startswith(name + "{"))
        self.assertEqual(rule["name"]["as"], name)
        self.assertEqual(set(rule["resources"]["overrides"]), {"namespace", "pod"})
        # The server exports it as a gauge.
        with ArborServer([], grpc=False, env=clean_env()) as srv:
            text = raw(srv.port, "GET", "/metrics")[1]
        self.assertIn(f"# TYPE {name} gauge", text)
        self.assertRegex(text, rf"(?m)^{name} 0$")


if __name__ == "__main__":
    unittest.main()
