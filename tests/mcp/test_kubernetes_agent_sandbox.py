"""deploy/kubernetes/agent-sandbox: the objects a cluster with Kubernetes
agent-sandbox (kubernetes-sigs/agent-sandbox v0.5.6) is given. No cluster
runs here, so: each overlay renders with `kubectl kustomize`; the
SandboxTemplate, SandboxWarmPool and SandboxClaim validate against the CRD
schemas of that release (vendored in tests/data/agent-sandbox/), strictly
(an unknown field is an error, as `kubectl apply`'s server-side field
validation makes it); the pod template's pod spec, and the NetworkPolicy the
controller makes from the template, validate with `kubernetes-validate
--strict` against Kubernetes 1.33 and 1.36; and the pod keeps the base's
sandbox settings. Controls: a misspelt field, a wrong enum value and a
missing required field are each rejected."""

import copy
import os
import pathlib
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "agent-sandbox"
DEPLOY = ROOT / "deploy" / "kubernetes"
VERSIONS = ["1.33", "1.36"]
PROFILES = {"default": "default", "registries": "registries", "dev": "dev"}
CRDS = {
    "SandboxTemplate": "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
    "SandboxWarmPool": "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
    "SandboxClaim": "extensions.agents.x-k8s.io_sandboxclaims.yaml",
}


def strict(schema):
    """The CRD's schema with unknown fields refused: every object that lists
    its properties gets `additionalProperties: false` (unless it preserves
    unknown fields or already says what else it takes)."""
    s = copy.deepcopy(schema)

    def walk(n):
        if isinstance(n, dict):
            if "properties" in n and "additionalProperties" not in n and not n.get("x-kubernetes-preserve-unknown-fields"):
                n["additionalProperties"] = False
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    walk(s)
    return s


@pytest.fixture(scope="module")
def schemas():
    out = {}
    for kind, f in CRDS.items():
        crd = yaml.safe_load((DATA / f).read_text())
        assert crd["spec"]["names"]["kind"] == kind
        for v in crd["spec"]["versions"]:
            out[(kind, f"{crd['spec']['group']}/{v['name']}")] = strict(v["schema"]["openAPIV3Schema"])
    return out


def validate(schemas, obj):
    jsonschema.validate(obj, schemas[(obj["kind"], obj["apiVersion"])])


def render(path, tmp):
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp)}, timeout=120)
    assert out.returncode == 0, out.stderr
    return {o["kind"]: o for o in yaml.safe_load_all(out.stdout)}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl (with kustomize) is missing: these machines have it preinstalled")
    tmp = tmp_path_factory.mktemp("k8s")
    out = {p: render(DEPLOY / "agent-sandbox" / p, tmp) for p in PROFILES}
    out["base"] = render(DEPLOY / "base", tmp)
    return out


def claim():
    return yaml.safe_load((DEPLOY / "agent-sandbox" / "claim.yaml").read_text())


def pod_of(template):
    spec = template["spec"]["podTemplate"]["spec"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sandbox-1", "namespace": "agents"}, "spec": spec}


def policy_of(template):
    """The NetworkPolicy agent-sandbox's controller makes from a template
    with a networkPolicy (extensions/controllers/sandboxtemplate_controller.go)."""
    np = template["spec"]["networkPolicy"]
    spec = {"podSelector": {"matchLabels": {"agents.x-k8s.io/sandbox-template-ref-hash": "0"}}, "policyTypes": ["Ingress", "Egress"]}
    spec.update({k: np[k] for k in ("ingress", "egress") if k in np})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "t", "namespace": "agents"}, "spec": spec}


@pytest.mark.parametrize("profile", PROFILES)
def test_each_overlay_renders_a_template_and_its_pool_valid_against_the_crds(rendered, schemas, profile):
    r = rendered[profile]
    assert set(r) == {"SandboxTemplate", "SandboxWarmPool"}, "the base's Job, Service and NetworkPolicy are dropped"
    for o in r.values():
        validate(schemas, o)
    assert r["SandboxWarmPool"]["spec"]["sandboxTemplateRef"]["name"] == r["SandboxTemplate"]["metadata"]["name"]
    validate(schemas, claim())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_the_pod_and_the_policy_validate_strictly(rendered, profile, version):
    t = rendered[profile]["SandboxTemplate"]
    kubernetes_validate.validate(pod_of(t), version, strict=True)
    kubernetes_validate.validate(policy_of(t), version, strict=True)


def test_positive_controls_broken_objects_are_rejected(rendered, schemas):
    t = copy.deepcopy(rendered["default"]["SandboxTemplate"])
    t["spec"]["podTemplate"]["spec"]["hostUser"] = False
    with pytest.raises(jsonschema.ValidationError, match="hostUser"):
        validate(schemas, t)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod_of(t), "1.36", strict=True)
    pool = copy.deepcopy(rendered["default"]["SandboxWarmPool"])
    pool["spec"]["updateStrategy"] = {"type": "Rolling"}
    with pytest.raises(jsonschema.ValidationError, match="Rolling"):
        validate(schemas, pool)
    c = claim()
    del c["spec"]["warmPoolRef"]["name"]
    with pytest.raises(jsonschema.ValidationError, match="name"):
        validate(schemas, c)
    bad = policy_of(rendered["registries"]["SandboxTemplate"])
    bad["spec"]["egress"][0]["ports"][0]["protocoll"] = "UDP"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.36", strict=True)


SANDBOX_SETTINGS = ("hostUsers", "automountServiceAccountToken", "enableServiceLinks", "securityContext")


@pytest.mark.parametrize("profile", PROFILES)
def test_the_pod_keeps_the_bases_sandbox_settings(rendered, profile):
    job = rendered["base"]["Job"]["spec"]["template"]["spec"]
    p = rendered[profile]["SandboxTemplate"]["spec"]["podTemplate"]["spec"]
    for k in SANDBOX_SETTINGS:
        assert p[k] == job[k], k
    (c,), (jc,) = p["containers"], job["containers"]
    assert c["securityContext"] == jc["securityContext"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SETFCAP"]}
    assert p["hostUsers"] is False and c["securityContext"]["procMount"] == "Unmasked"
    assert c["resources"] == jc["resources"]
    assert "@sha256:" in c["image"] and not c["image"].startswith("registry.invalid/")


@pytest.mark.parametrize("profile", PROFILES)
def test_a_pooled_pod_holds_no_secret_and_waits_unclaimed(rendered, profile):
    """A pod started before any claim must hold nothing a later claim uses:
    no Secret volume, no token file, no token in the environment; it starts
    `--unclaimed` and takes the token in the header the router leaves."""
    p = rendered[profile]["SandboxTemplate"]["spec"]["podTemplate"]["spec"]
    (c,) = p["containers"]
    assert not any("secret" in v or "projected" in v for v in p["volumes"])
    assert not any("secretKeyRef" in str(e) for e in c["env"])
    args = c["args"]
    assert "--unclaimed" in args and "--token-file" not in args
    assert args[args.index("--token-header") + 1] == "X-Sandmux-Token"
    assert args[args.index("--profile") + 1] == PROFILES[profile]
    assert int(args[args.index("--upstream-timeout") + 1]) < 180, "under the router's timeout"
    assert "--audit-stdout" in args, "the audit log outlives the pod"
    c2 = claim()["spec"]
    assert "env" not in c2 and "volumeClaimTemplates" not in c2, "either forces a cold start"


@pytest.mark.parametrize("profile", PROFILES)
def test_the_router_reaches_the_port_and_the_host_it_sends_is_allowed(rendered, profile):
    """The router dials <pod IP>:8888 (its default port) or
    <sandbox>.<namespace>.svc.cluster.local:8888 and sends that as Host:
    both are allowed through the Downward API variables Kubernetes expands
    in args; only the router's pods may connect."""
    t = rendered[profile]["SandboxTemplate"]["spec"]
    (c,) = t["podTemplate"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--http") + 1] == "0.0.0.0:8888"
    assert [pt["containerPort"] for pt in c["ports"]] == [8888]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_IP": "status.podIP", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    hosts = [args[i + 1] for i, a in enumerate(args) if a == "--allowed-host"]
    assert hosts == ["$(POD_IP)", "$(POD_NAME).$(POD_NAMESPACE).svc.cluster.local"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "mcp"}, probe
    (rule,) = t["networkPolicy"]["ingress"]
    assert rule["ports"] == [{"port": 8888, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}}, "podSelector": {"matchLabels": {"app": "sandbox-router"}}}]


def test_egress_is_what_each_profile_needs(rendered):
    """default: nothing (network none). registries (proxy) and dev (host):
    the cluster DNS, which agent-sandbox's own default policy blocks, and TCP
    80/443 to public addresses only."""
    assert rendered["default"]["SandboxTemplate"]["spec"]["networkPolicy"]["egress"] == []
    for p in ("registries", "dev"):
        dns, web = rendered[p]["SandboxTemplate"]["spec"]["networkPolicy"]["egress"]
        assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
        assert sorted((x["port"], x["protocol"]) for x in dns["ports"]) == [(53, "TCP"), (53, "UDP")]
        assert sorted(x["port"] for x in web["ports"]) == [80, 443]
        v4 = web["to"][0]["ipBlock"]
        assert v4["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "169.254.0.0/16"} <= set(v4["except"])
