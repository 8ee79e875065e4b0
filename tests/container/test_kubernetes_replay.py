"""The pod of deploy/kubernetes replayed under rootful podman: each setting
of the rendered Job translated into podman's flag for it (podman 4.3's
`kube play` may ignore some of them), then `sandmux check` must be
enforceable, and `serve --http` with the Job's own arguments must answer
/healthz, refuse a request without the token and serve one with it, and
end with status 0 on `podman stop`. The controls: every capability dropped
(no SETFCAP) fails the userns layer, and without `procMount: Unmasked` the
sandbox cannot mount its /proc. Containers are named sandmux-k8s-replay-*."""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

import harness

# The pod's user namespace (hostUsers: false): root inside is this host uid.
USERNS_BASE = 200000


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl (with kustomize) is missing: these machines have it preinstalled")
    d = tmp_path_factory.mktemp("k8s") / "kubernetes"
    shutil.copytree(harness.ROOT / "deploy" / "kubernetes", d, ignore=shutil.ignore_patterns("token"))
    (d / "examples" / "session" / "token").write_text("unused-here-0123456789\n")
    out = subprocess.run(["kubectl", "kustomize", str(d / "examples" / "session")], capture_output=True, text=True,
                         env={**os.environ, "HOME": str(d)}, timeout=120)
    assert out.returncode == 0, out.stderr
    (j,) = [o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "Job"]
    return j


def flags(job, rt, caps=None, unmask=True):
    """podman flags for the pod's settings; fails on a setting it does not know."""
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert set(sc) == {"privileged", "allowPrivilegeEscalation", "procMount", "capabilities"}, sc
    assert pod["hostUsers"] is False and sc["privileged"] is False
    assert pod["securityContext"]["seccompProfile"]["localhostProfile"] == "sandmux/seccomp.json"
    f = [f"--uidmap=0:{USERNS_BASE}:65536", f"--gidmap=0:{USERNS_BASE}:65536",
         "--security-opt", f"seccomp={rt.share / 'seccomp.json'}"]
    if sc["procMount"] == "Unmasked" and unmask:
        f += ["--security-opt", "unmask=/proc/*"]
    if sc["allowPrivilegeEscalation"] is False:
        f += ["--security-opt", "no-new-privileges"]
    cap = sc["capabilities"] if caps is None else caps
    f += [f"--cap-drop={d}" for d in cap.get("drop", [])] + [f"--cap-add={a}" for a in cap.get("add", [])]
    lim = c["resources"]["limits"]
    f += ["--memory", lim["memory"].replace("Gi", "g").replace("Mi", "m"), "--cpus", str(lim["cpu"])]
    return f


def check(rt, job, name, **kw):
    p = rt.run("run", "--rm", "--name", name, "--network", "none", *flags(job, rt, **kw), harness.IMAGE,
               "check", "-p", "default", "--workspace-mode", "live", "--json")
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        return p.returncode, {"error": p.stderr}


def test_check_is_enforceable_with_the_pods_settings(rootful, job):
    code, rep = check(rootful, job, "sandmux-k8s-replay-check")
    assert code == 0 and rep["all_passed"], rep.get("error")
    assert harness.dropped(rep) == ["cgroup"]


def test_control_every_capability_dropped_fails_the_userns_layer(rootful, job):
    code, rep = check(rootful, job, "sandmux-k8s-replay-nocaps", caps={"drop": ["ALL"]})
    assert code == 3 and "userns" in rep["error"] and "id maps" in rep["error"], rep


def test_control_without_procmount_unmasked_the_sandbox_has_no_proc(rootful, job):
    code, rep = check(rootful, job, "sandmux-k8s-replay-masked", unmask=False)
    assert code == 3 and "procfs" in rep["error"], rep


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, headers=None, data=None):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_serve_http_with_the_jobs_arguments_answers_and_stops_cleanly(rootful, job, tmp_path):
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "token"]
    token = os.urandom(24).hex()
    tdir = tmp_path / "secret"
    tdir.mkdir()
    (tdir / "token").write_text(token + "\n")
    os.chown(tdir / "token", USERNS_BASE, USERNS_BASE)  # root-owned inside, as the kubelet writes it
    (tdir / "token").chmod(0o400)
    port = free_port()
    name = "sandmux-k8s-replay-serve"
    rootful.run("rm", "-f", name)
    args = [a.replace("$(POD_NAMESPACE)", "agents") for a in c["args"]]
    p = rootful.run("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:{c['ports'][0]['containerPort']}",
                    "-v", f"{tdir}:{mount['mountPath']}:ro", *flags(job, rootful), harness.IMAGE, *args)
    assert p.returncode == 0, p.stderr
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            logs = rootful.run("logs", name).stderr
            if "serving MCP at" in logs:
                break
            time.sleep(0.1)
        assert "serving MCP at http://0.0.0.0:8765/mcp" in logs, logs
        assert get(f"{base}/healthz") == (200, b"ready\n")
        host = {"Host": f"{job['metadata']['name']}.agents.svc:8765"}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "replay", "version": "1"}}}).encode()
        mcp = {**host, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        assert get(f"{base}/mcp", mcp, body)[0] == 401
        status, answer = get(f"{base}/mcp", {**mcp, "Authorization": f"Bearer {token}"}, body)
        assert status == 200 and b'"serverInfo":{"name":"sandmux"' in answer
        stop = rootful.run("stop", "-t", "10", name)
        assert stop.returncode == 0, stop.stderr
        state = rootful.run("inspect", name, "--format", "{{.State.ExitCode}}")
        assert state.stdout.strip() == "0"
    finally:
        rootful.run("rm", "-f", name)
