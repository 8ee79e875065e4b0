"""deploy/kubernetes: no cluster can run on these machines, so what can be
proved here is: the session overlay renders with `kubectl kustomize`, every
object validates strictly (unknown fields rejected) against the Kubernetes
1.33 and 1.36 schemas (PyPI kubernetes-validate), and the rendered pod has
the settings that give sandmux its layers. The control: strict validation
does reject a misspelt field."""

import copy
import os
import pathlib
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSIONS = ["1.33", "1.36"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl (with kustomize) is missing: these machines have it preinstalled")
    d = tmp_path_factory.mktemp("k8s") / "kubernetes"
    shutil.copytree(ROOT / "deploy" / "kubernetes", d, ignore=shutil.ignore_patterns("token"))
    (d / "examples" / "session" / "token").write_text(os.urandom(24).hex() + "\n")
    env = {**os.environ, "HOME": str(d)}
    out = subprocess.run(["kubectl", "kustomize", str(d / "examples" / "session")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return {o["kind"]: o for o in yaml.safe_load_all(out.stdout)}


def test_the_base_alone_names_no_pullable_image(tmp_path):
    """The base's image is an unpullable placeholder (before: `sandmux`, i.e.
    docker.io/library/sandmux:latest); the overlay's pin replaces it (the
    control: test_the_pod_gives_sandmux_its_layers sees the digest)."""
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "kubernetes" / "base")], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=120)
    assert out.returncode == 0, out.stderr
    job = next(o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "Job")
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.invalid/sandmux@sha256:" + "0" * 64


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_strictly(rendered, version):
    assert set(rendered) == {"Secret", "Service", "Job", "NetworkPolicy"}
    for o in rendered.values():
        kubernetes_validate.validate(o, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_positive_control_strict_validation_rejects_a_misspelt_field(rendered, version):
    job = copy.deepcopy(rendered["Job"])
    job["spec"]["template"]["spec"]["hostUser"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, version, strict=True)


def pod(rendered):
    return rendered["Job"]["spec"]["template"]["spec"]


def test_the_pod_gives_sandmux_its_layers(rendered):
    p = pod(rendered)
    assert p["hostUsers"] is False, "user namespaces on"
    assert p["automountServiceAccountToken"] is False
    assert p["securityContext"]["seccompProfile"] == {"type": "Localhost", "localhostProfile": "sandmux/seccomp.json"}
    assert (ROOT / "container" / "seccomp.json").is_file()
    assert rendered["Job"]["spec"]["backoffLimit"] == 0
    (c,) = p["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["procMount"] == "Unmasked"
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SETFCAP"]}
    assert not any(k in p for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert re.fullmatch(r"[a-z0-9.\-/]+@sha256:[0-9a-f]{64}", c["image"]), "image pinned by digest"
    assert not c["image"].startswith("registry.invalid/"), "the overlay replaced the placeholder"
    for k in ("cpu", "memory", "ephemeral-storage"):
        assert c["resources"]["limits"][k] and c["resources"]["requests"][k]


def test_serve_listens_with_the_secret_token_and_the_services_names(rendered):
    p = pod(rendered)
    (c,) = p["containers"]
    args = c["args"]
    assert args[:1] == ["serve"] and args[args.index("--http") + 1] == "0.0.0.0:8765"
    token = args[args.index("--token-file") + 1]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "token"]
    assert pathlib.PurePath(token).parent == pathlib.PurePath(mount["mountPath"]) and mount["readOnly"]
    (vol,) = [v for v in p["volumes"] if v["name"] == "token"]
    assert vol["secret"]["defaultMode"] == 0o400, "owner-only, as --token-file demands"
    assert vol["secret"]["secretName"] == rendered["Secret"]["metadata"]["name"]
    assert "token" in rendered["Secret"]["data"]
    svc = rendered["Service"]["metadata"]["name"]
    hosts = [args[i + 1] for i, a in enumerate(args) if a == "--allowed-host"]
    assert hosts == [svc, f"{svc}.$(POD_NAMESPACE).svc", f"{svc}.$(POD_NAMESPACE).svc.cluster.local"]
    probe = c["readinessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "mcp"}
    assert [pt["containerPort"] for pt in c["ports"] if pt["name"] == "mcp"] == [8765]


def test_the_service_and_the_policy_select_only_this_session(rendered):
    labels = rendered["Job"]["spec"]["template"]["metadata"]["labels"]
    assert rendered["Service"]["spec"]["selector"] == {"sandmux.dev/session": labels["sandmux.dev/session"]}
    np = rendered["NetworkPolicy"]["spec"]
    assert np["podSelector"]["matchLabels"] == rendered["Service"]["spec"]["selector"]
    assert sorted(np["policyTypes"]) == ["Egress", "Ingress"] and np["egress"] == []
    (rule,) = np["ingress"]
    assert rule["ports"] == [{"port": 8765, "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"sandmux.dev/client": labels["sandmux.dev/session"]}}}]
