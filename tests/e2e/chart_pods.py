"""The chart's containers as local processes, run the way a kubelet runs them in their pods.

`helm template` renders the chart; each container of each workload becomes one process:

- argv: the container's `command` (else the image's ENTRYPOINT, read from the Containerfile)
  and its `args`, exactly; `fleetpulse` is the development venv's (the image's PATH holds the
  installed package, here the venv's bin/ takes that place);
- environment: the image's (the Containerfile's ENV, HOME of its user), what a kubelet adds
  (KUBERNETES_SERVICE_HOST/PORT, HOSTNAME) and the container's rendered `env`, nothing of the
  test's own (with-services.sh exports FLEETPULSE_KAFKA__BOOTSTRAP: a process must not see it);
- files: every volumeMount at its rendered mountPath, in a mount namespace of the process's
  own (`unshare --mount`), so nothing is rewritten and nothing on the machine is touched:
  emptyDir volumes and a StatefulSet's claims are fresh folders, Secret and ConfigMap
  volumes hold the objects' keys as
  the API server has them, and a pod that automounts its ServiceAccount token gets a token
  the API server issued for that ServiceAccount (TokenRequest), the CA and the namespace at
  /var/run/secrets/kubernetes.io/serviceaccount, as the admission plugin and kubelet give it;
  a mount path the machine lacks is made in an overlay of its parent (the machine's folder
  seen unchanged); `readOnlyRootFilesystem` makes every other path read-only;
- the working directory is the container's `workingDir`;
- the user: `runAsUser`/`runAsGroup` with `fsGroup` as a supplementary group and no new
  privileges (setpriv; when the test runs as root, as on these machines); emptyDirs are
  world-writable and Secret files group-owned by the fsGroup, as the kubelet makes them. The
  development venv's interpreter lies under /root, which others cannot enter: in the
  namespace an empty /root holds only the way to it.

Not as in a pod: the processes share the machine's network (the chart's metricsPort 0 lets
each pick a port).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "fleetpulse"
VENV_BIN = REPO / ".venv" / "bin"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}


@dataclass
class Mount:
    path: str  # where the process sees it
    source: Path  # the folder on this machine
    read_only: bool


@dataclass
class Container:
    """One rendered container, ready to run as a process."""

    workload: str  # kind/name
    name: str
    argv: list[str]
    env: dict[str, str]
    working_dir: str
    mounts: list[Mount] = field(default_factory=list)
    read_only_root: bool = False
    grace_s: float = 30.0  # the pod's terminationGracePeriodSeconds: SIGTERM, then SIGKILL
    run_as: tuple[int, int, int] | None = None  # runAsUser, runAsGroup, fsGroup

    def popen(self, log: Path, scratch: Path) -> subprocess.Popen[bytes]:
        """Start it in a mount namespace of its own; output to `log`."""
        script = _namespace_script(self, scratch)
        with log.open("ab") as out:
            return subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                env=self.env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def run(self, log: Path, scratch: Path, timeout: float) -> int:
        """Run it to completion (a Job's container); its exit status."""
        return self.popen(log, scratch).wait(timeout)


def render(helm: str, release: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", namespace, *args],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


@dataclass(frozen=True)
class Image:
    """What the Containerfile's final stage gives every container."""

    entrypoint: list[str]
    env: dict[str, str]


def image() -> Image:
    text = (REPO / "Containerfile").read_text()
    final = text.rsplit("\nFROM ", 1)[1].replace("\\\n", " ")
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", final, re.M)
    assert entrypoint, "the Containerfile has no ENTRYPOINT in exec form"
    env = {}
    for line in re.findall(r"^ENV (.*)$", final, re.M):
        env.update(dict(pair.split("=", 1) for pair in shlex.split(line)))
    home = re.search(r"--home-dir (\S+)", final)
    assert home, "the Containerfile's user has no --home-dir"
    path = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return Image(yaml.safe_load(entrypoint[1]), {"PATH": path, "LANG": "C.UTF-8",
                                                  **env, "HOME": home[1]})  # fmt: skip


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    workload = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    spec: dict[str, Any] = workload["template"]["spec"]
    return spec


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """kind/name -> the rendered workload."""
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs if d["kind"] in WORKLOADS}


@dataclass
class Kubelet:
    """What a kubelet and the admission plugins add to a pod on this API server."""

    kube: Any  # tests.kube_fixture.Kube
    namespace: str
    api_port: int
    scratch: Path

    def containers(self, key: str, doc: dict[str, Any]) -> list[Container]:
        spec = pod_spec(doc)
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        volumes = {v["name"]: self._volume(key, v, fs_group) for v in spec.get("volumes", [])}
        for claim in doc["spec"].get("volumeClaimTemplates", []):  # pod 0's claim
            name = claim["metadata"]["name"]
            volumes[name] = self._claim(f"{name}-{doc['metadata']['name']}-0", fs_group)
        sa_mount = self._service_account(key, spec)
        base = {**image().env, "HOSTNAME": f"{doc['metadata']['name']}-{uuid.uuid4().hex[:5]}",
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.api_port)}  # fmt: skip
        pod_security = spec.get("securityContext", {})
        out = []
        for c in spec["containers"]:
            security = {**pod_security, **c.get("securityContext", {})}
            mounts = [Mount(m["mountPath"], volumes[m["name"]], bool(m.get("readOnly")))
                      for m in c.get("volumeMounts", [])]  # fmt: skip
            if sa_mount is not None:
                mounts.append(sa_mount)
            out.append(Container(
                key, c["name"], [*c.get("command", image().entrypoint), *c.get("args", [])],
                {**base, **_env(c)}, c.get("workingDir", "/"), mounts,
                bool(security.get("readOnlyRootFilesystem")),
                float(spec.get("terminationGracePeriodSeconds", 30)), _run_as(security)))  # fmt: skip
        return out

    def _volume(self, key: str, volume: dict[str, Any], fs_group: int | None) -> Path:
        folder = self.scratch / "volumes" / key.replace("/", "-") / volume["name"]
        folder.mkdir(parents=True)
        if "emptyDir" in volume:
            folder.chmod(0o777)  # as the kubelet makes an emptyDir: any user of the pod writes
            return folder
        for kind in ("secret", "configMap"):
            if kind in volume:
                self._write_items(folder, kind, volume[kind], fs_group)
                return folder
        if "persistentVolumeClaim" in volume:  # a StatefulSet pod's claim, by its name
            return self._claim(volume["persistentVolumeClaim"]["claimName"], fs_group)
        raise AssertionError(f"{key}: volume {volume['name']}: expected emptyDir, secret, "
                             f"configMap or persistentVolumeClaim, got {sorted(volume)}")  # fmt: skip

    def _claim(self, name: str, fs_group: int | None) -> Path:
        """The persistent volume of the claim `name`, made fresh by its first user, owned by
        the pod's fsGroup as the kubelet mounts it."""
        folder = self.scratch / "claims" / name
        if folder.exists():
            return folder
        folder.mkdir(parents=True)
        if fs_group is not None and os.geteuid() == 0:
            os.chown(folder, 0, fs_group)
        folder.chmod(0o2775)
        return folder

    def _write_items(self, folder: Path, kind: str, source: dict[str, Any],
                     fs_group: int | None) -> None:  # fmt: skip
        if kind == "secret":
            obj = self.kube.core.read_namespaced_secret(source["secretName"], self.namespace)
            data = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
        else:
            obj = self.kube.core.read_namespaced_config_map(source["name"], self.namespace)
            data = {k: v.encode() for k, v in (obj.data or {}).items()}
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            path = folder / item["path"]
            path.write_bytes(data[item["key"]])
            path.chmod(item.get("mode", source.get("defaultMode", 0o644)))
            if fs_group is not None and os.geteuid() == 0:
                os.chown(path, 0, fs_group)  # the pod's fsGroup owns its volumes' files

    def _service_account(self, key: str, spec: dict[str, Any]) -> Mount | None:
        """The token volume the ServiceAccount admission plugin adds (unless opted out)."""
        if spec.get("automountServiceAccountToken") is False:
            return None
        account = spec.get("serviceAccountName", "default")
        request = {"spec": {"audiences": ["https://kubernetes.default.svc"],
                            "expirationSeconds": 3600}}  # fmt: skip
        token = self.kube.core.create_namespaced_service_account_token(
            account, self.namespace, request).status.token  # fmt: skip
        folder = self.scratch / "volumes" / key.replace("/", "-") / "kube-api-access"
        folder.mkdir(parents=True)
        ca = base64.b64decode(yaml.safe_load(Path(self.kube.kubeconfig).read_text())
                              ["clusters"][0]["cluster"]["certificate-authority-data"])  # fmt: skip
        for name, data in (("token", token.encode()), ("ca.crt", ca),
                           ("namespace", self.namespace.encode())):  # fmt: skip
            (folder / name).write_bytes(data)
        return Mount(SA_DIR, folder, True)


def _run_as(security: dict[str, Any]) -> tuple[int, int, int] | None:
    if "runAsUser" not in security:
        return None
    user = int(security["runAsUser"])
    group = int(security.get("runAsGroup", user))
    return user, group, int(security.get("fsGroup", group))


def _env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for entry in container.get("env", []):
        assert "value" in entry, f"env {entry['name']}: only plain values are run here, got {entry}"
        env[entry["name"]] = str(entry["value"])
    return env


def _namespace_script(container: Container, scratch: Path) -> str:
    """Shell run inside the new mount namespace: the pod's mounts, a read-only root, then exec."""
    lines = ["set -e"]
    if container.run_as is not None and os.geteuid() == 0:
        lines += _reachable(os.path.realpath(VENV_BIN / "python3"), scratch)
    overlays: list[str] = []
    paths = [m.path.rstrip("/") + "/" for m in container.mounts]
    nested = [(a, b) for a in paths for b in paths if a != b and b.startswith(a)]
    assert not nested, f"{container.workload}: nested mount paths are not run here: {nested}"
    # the deepest first: a mount over /tmp would hide the sources still to mount from there
    for mount in sorted(container.mounts, key=lambda m: -len(m.path)):
        target = os.path.realpath(mount.path)
        if not os.path.exists(target):
            parent = _existing_parent(target)
            if parent not in overlays:
                overlays.append(parent)
                lines.append(_overlay(parent, scratch))
            lines.append(f"mkdir -p {shlex.quote(target)}")
        hidden = _hides_the_checkout(target)
        lines += hidden[0]
        lines.append(f"mount --bind {shlex.quote(str(mount.source))} {shlex.quote(target)}")
        lines += hidden[1]
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
    if container.read_only_root:
        lines += [f"mount -o remount,bind,ro {shlex.quote(p)}" for p in overlays]
        lines.append("mount -o remount,bind,ro /")
    lines.append(f"cd {shlex.quote(container.working_dir)}")
    lines.append("exec " + shlex.join(_as_user(container) + container.argv))
    return "\n".join(lines)


def _hides_the_checkout(target: str) -> tuple[list[str], list[str]]:
    """Shell lines before and after mounting over `target` when it holds the checkout (a clone
    under /tmp, and a pod's emptyDir at /tmp): the checkout, with the venv the process runs, is
    parked on a tmpfs of the namespace's own and put back at its path inside the new mount."""
    checkout = os.path.realpath(REPO)
    if not checkout.startswith(target.rstrip("/") + "/"):
        return [], []
    park = "/mnt/fleetpulse-checkout"  # /mnt: a folder no pod of the chart mounts over
    before = ["mount -t tmpfs -o mode=755 tmpfs /mnt", f"mkdir -p {park}",
              f"mount --bind {shlex.quote(checkout)} {park}"]  # fmt: skip
    after = [f"mkdir -p {shlex.quote(checkout)}", f"mount --move {park} {shlex.quote(checkout)}"]
    return before, after


def _as_user(container: Container) -> list[str]:
    """setpriv to the pod's user, group and fsGroup, no new privileges (only root can)."""
    if container.run_as is None or os.geteuid() != 0:
        return []
    user, group, fs_group = container.run_as
    return ["setpriv", f"--reuid={user}", f"--regid={group}", f"--groups={fs_group}",
            "--no-new-privs", "--"]  # fmt: skip


def _reachable(path: str, scratch: Path) -> list[str]:
    """Shell lines letting any user reach `path` (the venv's interpreter): a folder on the way
    others cannot enter (/root) is covered by an empty tmpfs they can, with only the way to
    `path` bound back into it; the rest of that folder stays hidden, as in an image."""
    parts = Path(path).parts
    for depth in range(2, len(parts)):
        folder = Path(*parts[:depth])
        if not os.stat(folder).st_mode & 0o001:
            child = shlex.quote(str(Path(*parts[: depth + 1])))
            stage = scratch / "reach" / uuid.uuid4().hex[:8]
            stage.mkdir(parents=True)
            return [f"mount --bind {child} {stage}",
                    f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(folder))}",
                    f"mkdir -p {child}", f"mount --move {stage} {child}"]  # fmt: skip
    return []


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _overlay(lower: str, scratch: Path) -> str:
    """An overlay of `lower` whose writes land in scratch: the machine's folder is unchanged."""
    layer = scratch / "overlays" / uuid.uuid4().hex[:8]
    (layer / "upper").mkdir(parents=True)
    (layer / "work").mkdir()
    options = f"lowerdir={lower},upperdir={layer / 'upper'},workdir={layer / 'work'}"
    return f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(lower)}"
