"""The pod of deploy/kubernetes/agent-sandbox (the SandboxTemplate's pod
spec) replayed under rootful podman, each setting translated as
test_kubernetes_replay.py translates the Job's, and its arguments expanded
as the kubelet expands $(VAR) from the Downward API: the pooled pod is
ready and refuses every MCP request; `podman exec -i … sandmux token set`
(what `kubectl exec -i` runs) adopts it; the token is then served in
X-Sandmux-Token with the pod-IP Host the router sends, and refused in
Authorization; `podman stop` ends it with status 0, and the container's
stdout (what the cluster's log pipeline keeps) is the whole audit log,
sealed. Control: before the claim, the same request is refused."""

import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

import harness
import test_kubernetes_replay as job_replay

POD = {"POD_IP": "10.88.0.7", "POD_NAME": "sbx-1", "POD_NAMESPACE": "agents"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl (with kustomize) is missing: these machines have it preinstalled")
    d = tmp_path_factory.mktemp("k8s")
    out = subprocess.run(["kubectl", "kustomize", str(harness.ROOT / "deploy" / "kubernetes" / "agent-sandbox" / "default")],
                         capture_output=True, text=True, env={**os.environ, "HOME": str(d)}, timeout=120)
    assert out.returncode == 0, out.stderr
    (t,) = [o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "SandboxTemplate"]
    return t


def mcp_headers(extra):
    return {"Host": f"{POD['POD_IP']}:8888", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", **extra}


INIT = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"replay","version":"1"}}}'


def test_the_pooled_pod_is_adopted_by_token_set_and_its_audit_log_leaves_on_stdout(rootful, template, tmp_path):
    spec = template["spec"]["podTemplate"]["spec"]
    (c,) = spec["containers"]
    args = [re.sub(r"\$\((\w+)\)", lambda m: POD[m.group(1)], a) for a in c["args"]]
    port = job_replay.free_port()
    name = "sandmux-k8s-replay-pool"
    rootful.run("rm", "-f", name)
    flags = job_replay.flags({"spec": {"template": {"spec": spec}}}, rootful)
    p = rootful.run("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:{c['ports'][0]['containerPort']}",
                    *flags, harness.IMAGE, *args)
    assert p.returncode == 0, p.stderr
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            logs = rootful.run("logs", name).stderr
            if "serving MCP at" in logs:
                break
            time.sleep(0.1)
        assert "serving MCP at http://0.0.0.0:8888/mcp" in logs, logs
        inst = re.search(r"instance=(\w+)", logs).group(1)
        token = os.urandom(24).hex()
        assert job_replay.get(f"{base}/healthz") == (200, b"ready\n")
        assert job_replay.get(f"{base}/mcp", mcp_headers({"X-Sandmux-Token": f"Bearer {token}"}), INIT)[0] == 401
        s = rootful.run("exec", "-i", name, "sandmux", "token", "set", inst, input=token + "\n")
        assert s.returncode == 0 and "token_claimed" in s.stderr and token not in s.stdout + s.stderr, s.stderr
        status, answer = job_replay.get(f"{base}/mcp", mcp_headers({"X-Sandmux-Token": f"Bearer {token}"}), INIT)
        assert status == 200 and b'"serverInfo":{"name":"sandmux"' in answer
        assert job_replay.get(f"{base}/mcp", mcp_headers({"Authorization": f"Bearer {token}"}), INIT)[0] == 401
        stop = rootful.run("stop", "-t", "10", name)
        assert stop.returncode == 0, stop.stderr
        assert rootful.run("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
        out = rootful.run("logs", name).stdout
    finally:
        rootful.run("rm", "-f", name)
    assert '"error_type":"token_claimed"' in out and token not in out
    copy = tmp_path / "collected.jsonl"
    copy.write_text(out)
    v = subprocess.run([harness.BIN, "audit", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and "sealed" in v.stdout, v.stdout + v.stderr
