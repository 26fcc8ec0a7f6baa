"""FleetPulse as shipped: the wheel the Containerfile builds, installed into a clean virtual
environment, running the commands the chart and the README run.

Everything else in the suite runs from the source tree (an editable install), which is how a
wheel that left out `pipeline/kube` once shipped: the image's `fleetpulse actuate kubernetes`
could not import, and no test noticed. Here the wheel is built from exactly the files the
Containerfile's build stage copies (nothing else of the repository exists for the build), and
installed into a fresh virtual environment that sees the already-installed dependencies (one
`.pth` line naming the development venv's site-packages, no network) but never the source tree:
each command runs from an empty folder and the test checks that `pipeline` comes from the new
environment. The image itself cannot be built on these machines: no registry but the package
indexes resolves, so `FROM python:3.12-slim-bookworm` cannot be pulled (buildah runs here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient

from pipeline import __version__
from pipeline.config import KafkaSettings
from pipeline.wire import codec
from pipeline.wire.topics import topic_name
from tests.integration.test_kubernetes_actuator import CLUSTER, action
from tests.kube_fixture import Kube, kube  # noqa: F401  (the session's kube-apiserver fixture)

REPO = Path(__file__).resolve().parents[2]
# what the code reads at run time from the package besides its modules (pyproject package-data)
DATA_SUFFIXES = {".csv", ".json", ".sql", ".proto"}
# beside the code for its readers, never read by it (streams/README.md): not shipped
DOC_SUFFIXES = {".md"}
# a Python warning category in the build's output (SetuptoolsDeprecationWarning,
# BuildBackendWarning, ...); distutils' lower-case "warning: byte-compiling is disabled" is not one
WARNING = re.compile(r"\b[A-Z]\w*Warning\b")


@dataclass
class Shipped:
    """The built wheel and the clean virtual environment it is installed in."""

    wheel: Path
    venv: Path
    home: Path  # an empty working directory: nothing importable sits beside the commands
    build_log: str

    def env(self, extra: Mapping[str, str] = {}) -> dict[str, str]:
        # nothing of this test process's Python or FleetPulse settings leaks into the command
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTHON", "FLEETPULSE_", "VIRTUAL_ENV"))}  # fmt: skip
        path = f"{self.venv / 'bin'}{os.pathsep}{base.get('PATH', '')}"
        return {**base, "PATH": path, "PYTHONUNBUFFERED": "1", **extra}

    def fleetpulse(self, *args: str, extra: Mapping[str, str] = {},
                   timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run([str(self.venv / "bin" / "fleetpulse"), *args], cwd=self.home,
                              env=self.env(extra), capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "python"), "-c", code], cwd=self.home,
                              env=self.env(), capture_output=True, text=True, timeout=120,
                              check=False)  # fmt: skip


def build_stage_copies() -> list[str]:
    """The paths the Containerfile's build stage copies before `pip wheel`."""
    stages = (REPO / "Containerfile").read_text().split("\nFROM ")
    sources: list[str] = []
    for line in stages[1].splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *copied, _destination = line.split()[1:]
            sources.extend(copied)
    return sources


def _copy_build_context(into: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in build_stage_copies():
        source = REPO / name
        if source.is_dir():
            # links kept as links, as COPY keeps them (pipeline/schemas -> ../schemas)
            shutil.copytree(source, into / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(source, into / name)


def _run(*args: str | Path, cwd: Path | None = None,
         env: Mapping[str, str] | None = None) -> str:  # fmt: skip
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, f"{' '.join(map(str, args))}: exit {done.returncode}\n" \
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Shipped:
    root = tmp_path_factory.mktemp("shipped")
    context, wheels, venv, home = (root / n for n in ("context", "wheels", "venv", "home"))
    for folder in (context, home):
        folder.mkdir()
    _copy_build_context(context)
    # The Containerfile's `pip wheel --no-deps`, offline: the venv's setuptools builds it.
    # Verbose, so setuptools' warnings are in the output; bytecode allowed, as in the build stage.
    build_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    log = _run(sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-index",
               "--no-build-isolation", "--wheel-dir", wheels, ".", cwd=context, env=build_env)  # fmt: skip
    (wheel,) = wheels.glob("fleetpulse-*.whl")
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    _run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
         "--no-index", "--no-deps", wheel)  # fmt: skip
    # the dependencies: the development venv's site-packages, after the wheel's own files (a
    # .pth names a folder; the .pth files inside that folder, the editable install's, are not read)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_fleetpulse_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    return Shipped(wheel, venv, home, log)


def test_the_wheel_builds_without_warnings_and_ships_every_module_and_data_file(
    shipped: Shipped,
) -> None:
    warnings = sorted({m.group(0) for m in WARNING.finditer(shipped.build_log)})
    assert warnings == [], f"setuptools warned while building the wheel: {warnings}\n" + "\n".join(
        line for line in shipped.build_log.splitlines() if WARNING.search(line))
    names = set(zipfile.ZipFile(shipped.wheel).namelist())
    dist_info = f"fleetpulse-{__version__}.dist-info"
    expected = _package_files(REPO / "pipeline") | _package_files(REPO / "streams")
    missing = sorted(expected - names)
    assert missing == [], f"files of the package not in the wheel (pyproject package-data?): {missing}"
    assert {n.split("/")[0] for n in names} == {"pipeline", "streams", dist_info}
    assert "pipeline/kube/actuator.py" in names and "pipeline/sql/analyses/top_offenders.sql" in names
    license_text = zipfile.ZipFile(shipped.wheel).read(f"{dist_info}/licenses/LICENSE").decode()
    assert license_text == (REPO / "LICENSE").read_text()
    metadata = zipfile.ZipFile(shipped.wheel).read(f"{dist_info}/METADATA").decode()
    assert f"\nVersion: {__version__}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata


def _package_files(package: Path) -> set[str]:
    """Every module and data file under `package`, as the wheel names it (links followed, as
    setuptools follows them: pipeline/schemas is schemas/)."""
    found = set()
    for folder, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = Path(folder) / name
            if path.suffix == ".py" or path.suffix in DATA_SUFFIXES:
                found.add(path.relative_to(REPO).as_posix())
            elif path.suffix not in DOC_SUFFIXES:
                pytest.fail(f"{path}: neither a module nor a known data file ({DATA_SUFFIXES}); "
                            "add its suffix to pyproject's package-data and DATA_SUFFIXES")
    return found


def test_the_environment_runs_the_wheel_not_the_source_tree(shipped: Shipped) -> None:
    probe = shipped.python(
        "import importlib.metadata as md, importlib.util, json, sys, pipeline, streams\n"
        "from packaging.requirements import Requirement\n"
        "unmet = []\n"
        "for text in md.requires('fleetpulse') or []:\n"
        "    req = Requirement(text)\n"
        "    if req.marker and not req.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    try:\n"
        "        have = md.version(req.name)\n"
        "    except md.PackageNotFoundError:\n"
        "        have = None\n"
        "    if have is None or not req.specifier.contains(have, prereleases=True):\n"
        "        unmet.append(f'{req} (installed: {have})')\n"
        "print(json.dumps({'pipeline': pipeline.__file__, 'streams': streams.__file__,\n"
        "    'tests': importlib.util.find_spec('tests') is not None, 'path': sys.path,\n"
        "    'version': md.version('fleetpulse'), 'unmet': unmet}))"
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    for package in ("pipeline", "streams"):
        assert Path(seen[package]).is_relative_to(shipped.venv), \
            f"{package} imported from {seen[package]}, expected the wheel in {shipped.venv}"
    assert not seen["tests"], "the repository's tests/ is importable: the source tree leaked in"
    assert str(REPO) not in seen["path"], seen["path"]
    assert seen["version"] == __version__
    assert seen["unmet"] == [], f"dependencies the wheel declares but the image would lack: {seen['unmet']}"


def test_every_module_imports_from_the_wheel(shipped: Shipped) -> None:
    # `--help` imports the command modules only; each command's work is imported when it runs
    # (pipeline.kube, faust): import every module, as running every command would
    done = shipped.python(
        "import importlib, pkgutil, pipeline, streams\n"
        "failed = []\n"
        "for package in (pipeline, streams):\n"
        "    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        try:\n"
        "            importlib.import_module(module.name)\n"
        "        except Exception as exc:\n"
        "            failed.append(f'{module.name}: {exc!r}')\n"
        "print('\\n'.join(failed))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"modules that do not import from the wheel:\n{done.stdout}"


def test_every_command_answers_help_and_the_version(shipped: Shipped) -> None:
    version = shipped.fleetpulse("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"fleetpulse {__version__}")
    top = shipped.fleetpulse("--help")
    assert top.returncode == 0 and top.stdout.startswith("usage: fleetpulse"), top.stderr
    # each command and subcommand of the installed parser, through the console script's main()
    walked = shipped.python(
        "import argparse, contextlib, io, json\n"
        "from pipeline.cli import build_parser, main\n"
        "def walk(parser, path):\n"
        "    yield path\n"
        "    for action in parser._actions:\n"
        "        if isinstance(action, argparse._SubParsersAction):\n"
        "            for name, sub in action.choices.items():\n"
        "                yield from walk(sub, [*path, name])\n"
        "answers = {}\n"
        "for path in walk(build_parser(), []):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main([*path, '--help'])\n"
        "            code = None\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "    answers[' '.join(path)] = [code, out.getvalue()]\n"
        "print(json.dumps(answers))"
    )
    assert walked.returncode == 0, walked.stderr
    answers = json.loads(walked.stdout)
    wrong = {cmd: out[-300:] for cmd, (code, out) in answers.items()
             if code != 0 or not out.startswith(f"usage: fleetpulse {cmd}".rstrip())}  # fmt: skip
    assert wrong == {}, f"commands whose --help failed from the wheel: {wrong}"
    # `ingest xid` names a source, not a subcommand: such a command is checked by its first word
    nested = {path.split()[0] for path in answers if " " in path}
    used = {c if c.split()[0] in nested else c.split()[0]
            for c in chart_commands() | readme_commands()}  # fmt: skip
    assert used - set(answers) == set(), \
        f"commands the chart or README run that the installed CLI lacks: {used - set(answers)}"
    print(f"{len(answers)} commands answer --help from the wheel")


def chart_commands() -> set[str]:
    """The `fleetpulse` commands the chart's containers run: each `args:`'s leading words."""
    commands = set()
    for template in (REPO / "deploy" / "helm" / "fleetpulse" / "templates").glob("*.yaml"):
        for listed in re.findall(r"args: \[([^\]]*)\]", template.read_text()):
            words = []
            for word in (w.strip() for w in listed.split(",")):
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break  # an option, a path or a templated source name: the command ended
                words.append(word)
            commands.add(" ".join(words))
    assert {"worker", "actuate kubernetes", "watch kubernetes"} <= commands, commands
    return commands


def readme_commands() -> set[str]:
    """The commands of the README's command table (`fleetpulse lake compact\\|status` is two)."""
    rows = re.findall(r"^\| `fleetpulse ([a-z][a-z-]*)((?: [a-z][a-z-]*(?:\\\|[a-z][a-z-]*)*)?)",
                      (REPO / "README.md").read_text(), re.M)  # fmt: skip
    commands = {command for command, _ in rows}
    commands.update(f"{command} {sub}" for command, subs in rows
                    for sub in subs.strip().split("\\|") if sub)  # fmt: skip
    return commands


def test_the_demo_and_sql_read_their_data_from_the_wheel(shipped: Shipped) -> None:
    # catalogs (CSV), the lake's views and canned analyses (SQL), the report: package data
    demo = shipped.fleetpulse("demo", "--out", "demo", "--gpu-nodes", "4", "--tpu-slices", "1",
                              "--hours", "0.25", "--inject", "G1@300")  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert (shipped.home / "demo" / "report.html").stat().st_size > 10_000
    summary = shipped.fleetpulse("sql", "--lake", "demo/lake", "--query", "fleet_summary",
                                 "--format", "json")  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    (row,) = json.loads(summary.stdout)
    assert row["devices"] >= 4 * 8, row  # 4 GPU nodes of 8 GPUs, and the slice's chips
    listed = shipped.fleetpulse("sql", "--list")
    canned = {p.stem for p in (REPO / "sql" / "analyses").glob("*.sql")}
    assert listed.returncode == 0, listed.stderr
    assert canned <= set(re.findall(r"^(\w+)  ", listed.stdout, re.M)), listed.stdout


# --- real starts against the test broker and API server -------------------------------------


@pytest.fixture(scope="module")
def kafka_env(shipped: Shipped) -> Iterator[tuple[KafkaSettings, dict[str, str]]]:
    """A topic prefix of this module's own, its topics created by the wheel's `topics create`
    (as the chart's Job does), and deleted at the end."""
    bootstrap = os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092")
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        pytest.fail(f"Kafka is not reachable at {bootstrap} ({exc}); run the tests with `make test`")
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=2)  # fmt: skip
    env = {"FLEETPULSE_KAFKA__BOOTSTRAP": bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
           "FLEETPULSE_KAFKA__PARTITIONS": str(kafka.partitions),
           "FLEETPULSE_METRICS__PORT": "0"}  # fmt: skip
    created = shipped.fleetpulse("topics", "create", extra=env)
    assert created.returncode == 0, created.stdout + created.stderr
    try:
        yield kafka, env
    finally:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            mine = [t for t in admin.list_topics() if t.startswith(kafka.topic_prefix)]
            with contextlib.suppress(Exception):  # the results stand; the broker is only fuller
                admin.delete_topics(mine, timeout_ms=30_000)
        finally:
            admin.close()


def _start(shipped: Shipped, log: Path, *args: str, extra: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(shipped.venv / "bin" / "fleetpulse"), *args],
                                cwd=shipped.home, env=shipped.env(extra), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> float:
    """SIGTERM, as the kubelet stops a pod; the seconds it took to exit 0."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {timeout:.0f} s after SIGTERM:\n{log.read_text()[-2000:]}")
    assert code == 0, f"exit {code} after SIGTERM, expected 0:\n{log.read_text()[-2000:]}"
    return time.monotonic() - started


@pytest.mark.kafka
def test_the_worker_starts_from_the_wheel_and_stops_on_sigterm(
    shipped: Shipped, kafka_env: tuple[KafkaSettings, dict[str, str]], tmp_path: Path
) -> None:
    _, env = kafka_env
    log = tmp_path / "worker.log"
    extra = {**env, "FLEETPULSE_WORKER__DATADIR": str(tmp_path / "worker"),
             "FLEETPULSE_WORKER__SESSION_TIMEOUT_S": "6",
             "FLEETPULSE_WORKER__HEARTBEAT_INTERVAL_S": "1"}  # fmt: skip
    worker = _start(shipped, log, "worker", "--loglevel", "info", extra=extra)  # the chart's args
    try:
        started = time.monotonic()
        metrics = _wait_for(log, worker, r"metrics=(http://\S+)/metrics", 60).group(1)
        _wait_until_ready(f"{metrics}/readyz", worker, log, 90)
        print(f"worker from the wheel ready in {time.monotonic() - started:.1f} s")
    finally:
        took = _stop(worker, log, 60) if worker.poll() is None else None
    assert took is not None, f"the worker exited by itself:\n{log.read_text()[-2000:]}"
    assert "fleetpulse worker: stopped (exit 0)" in log.read_text()


def _wait_for(log: Path, proc: subprocess.Popen[bytes], pattern: str,
              timeout: float) -> re.Match[str]:  # fmt: skip
    deadline = time.monotonic() + timeout
    while not (found := re.search(pattern, log.read_text())):
        assert proc.poll() is None, f"exited {proc.returncode} before /{pattern}/:\n{log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no /{pattern}/ in {timeout:.0f} s:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)
    return found


def _wait_until_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    answer = "no answer"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            answer = f"{exc.code} {exc.read().decode(errors='replace')[:200]}"
        except OSError as exc:
            answer = repr(exc)
        assert proc.poll() is None, f"exited {proc.returncode} before ready:\n{log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"{url} not 200 in {timeout:.0f} s (last: {answer})"
        time.sleep(0.5)


@pytest.mark.kafka
def test_the_kubernetes_actuator_and_watcher_run_from_the_wheel(
    shipped: Shipped, kafka_env: tuple[KafkaSettings, dict[str, str]], kube: Kube,  # noqa: F811
    tmp_path: Path,
) -> None:
    kafka, env = kafka_env
    extra = {**env, "FLEETPULSE_KUBERNETES__KUBECONFIG": kube.kubeconfig,
             "FLEETPULSE_KUBERNETES__CLUSTER": CLUSTER,
             "FLEETPULSE_KUBERNETES__WATCH_TIMEOUT_S": "5"}  # fmt: skip
    real, dry = kube.node("wheel"), kube.node("wheel")
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    try:
        for act in (action(real, "cordon"), action(dry, "cordon", dry_run=True)):
            producer.send(topic_name(kafka, "actions"), key=f"{CLUSTER}/{act.target.name}".encode(),
                          value=codec.encode(act)).get(timeout=30)  # fmt: skip
    finally:
        producer.close()
    # the chart's `actuate kubernetes`, until idle: the real cordon done, the dry run only logged
    acted = shipped.fleetpulse("actuate", "kubernetes", "--idle-exit", "3", extra=extra, timeout=120)
    assert acted.returncode == 0, acted.stdout[-2000:] + acted.stderr[-2000:]
    assert kube.core.read_node(real).spec.unschedulable is True, acted.stdout
    assert not kube.core.read_node(dry).spec.unschedulable, "a dry-run action cordoned a node"
    assert "1 dry run" in acted.stdout, acted.stdout

    # the chart's `watch kubernetes`: the node it lists reaches fleet.inventory; SIGTERM stops it
    log = tmp_path / "watcher.log"
    watcher = _start(shipped, log, "watch", "kubernetes", extra=extra)
    try:
        key = f"{CLUSTER}/{real}".encode()
        deadline = time.monotonic() + 60
        while key not in _keys(kafka, "inventory"):
            assert watcher.poll() is None, f"the watcher exited:\n{log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no inventory record for {real} in 60 s"
    finally:
        took = _stop(watcher, log, 60) if watcher.poll() is None else None
    assert took is not None, f"the watcher exited by itself:\n{log.read_text()[-2000:]}"
    print(f"watcher from the wheel stopped {took:.1f} s after SIGTERM")


def _keys(kafka: KafkaSettings, suffix: str) -> set[bytes]:
    consumer = KafkaConsumer(topic_name(kafka, suffix), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=2000)  # fmt: skip
    try:
        return {record.key for record in consumer}
    finally:
        consumer.close()
