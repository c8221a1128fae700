#!/usr/bin/env python
"""Runs N processes of a JAX program under jax.distributed on this machine.

    python examples/launch.py -n 2 examples/train_dp.py --quick
    sudo python examples/launch.py -n 4 --netns 1gbit --pin examples/train_fsdp.py

Each worker is `python SCRIPT ARGS...` with four environment variables that
`init_jax()` (below; the examples call it first thing) turns into
`jax.distributed.initialize(coordinator_address="127.0.0.1:PORT",
num_processes=N, process_id=i)` on the CPU backend with gloo collectives and
`--local-devices` CPU devices per process (default 1):

    ZIPCCL_COORDINATOR      127.0.0.1:PORT (a free port)
    ZIPCCL_NUM_PROCESSES    N
    ZIPCCL_PROCESS_ID       i
    ZIPCCL_LOCAL_DEVICES    CPU devices per process

Options:
  --netns RATE  run every worker inside a fresh network namespace whose loopback
                is shaped by `tc qdisc ... tbf rate RATE` (e.g. 1gbit), so time
                on the wire dominates as it does between hosts. All workers
                share that one loopback, so RATE is the aggregate of all their
                traffic. Needs root and iproute2; the namespace is removed at the
                end, whatever happens. Only loopback inside it is touched.
  --pin         worker i runs under `taskset -c` on its own core (cores are
                reused round-robin when N exceeds them) with ZIPCCL_NUM_THREADS=1,
                so codec threads of different processes do not share a core.
  --deadline S  kill every worker and fail after S seconds (default 900).

Output: worker 0's output is echoed as it comes; every worker's output goes to
LOGDIR/worker<i>.log (a temporary directory unless --logdir). When a worker
exits non-zero, the others (which would wait forever inside a collective) are
killed and the launcher prints the failed worker's output and exits with its
code. `launch()` is the same as a function (the tests use it).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ENV_COORDINATOR = "ZIPCCL_COORDINATOR"
ENV_NUM_PROCESSES = "ZIPCCL_NUM_PROCESSES"
ENV_PROCESS_ID = "ZIPCCL_PROCESS_ID"
ENV_LOCAL_DEVICES = "ZIPCCL_LOCAL_DEVICES"


# ---- worker side --------------------------------------------------------------------------


def launched() -> bool:
  """True in a process started by this launcher."""
  return ENV_COORDINATOR in os.environ


def init_jax(default_devices: int = 8, malloc: str = "default") -> bool:
  """Configures JAX's CPU backend; call before anything starts a backend.

  Under the launcher: `--local-devices` CPU devices, gloo collectives and
  `jax.distributed.initialize` from the launcher's environment. Otherwise
  `default_devices` simulated CPU devices in this one process (or, when JAX's
  backend is already running, the devices it has).

  malloc="tuned" calls `zipccl_jax.tune_host_allocator()`: XLA:CPU allocates
  every buffer of every step afresh, and glibc maps each large one anew, so
  without it a step first-touches all its large buffers page by page (the
  compressed transport has more of them than raw: the encoded rows, the slot,
  the received slots). It runs before JAX starts its backend, so that its limit
  of one malloc arena binds XLA's worker threads too (a thread arena maps every
  buffer above 64 MiB afresh). "default" leaves malloc alone. The FSDP step over
  1 Gbit/s with 2 processes is ~5% faster tuned, raw and compressed alike.

  Returns:
    True when this process is one of several (jax.distributed is initialised).
  """
  import jax
  if malloc == "tuned":
    import zipccl_jax
    import warnings
    # Under a running backend (e.g. pytest) the one-arena limit comes too late for
    # the threads already running (tune_host_allocator warns); the mmap threshold
    # still applies.
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      zipccl_jax.tune_host_allocator()
  elif malloc != "default":
    raise ValueError(f"init_jax: malloc must be 'tuned' or 'default', got {malloc!r}")
  jax.config.update("jax_platforms", "cpu")
  if not launched():
    try:
      jax.config.update("jax_num_cpu_devices", default_devices)
    except RuntimeError:   # a backend is up already (e.g. under pytest): use its devices
      pass
    return False
  jax.config.update("jax_num_cpu_devices", int(os.environ.get(ENV_LOCAL_DEVICES, "1")))
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=os.environ[ENV_COORDINATOR],
                             num_processes=int(os.environ[ENV_NUM_PROCESSES]),
                             process_id=int(os.environ[ENV_PROCESS_ID]),
                             initialization_timeout=120, heartbeat_timeout_seconds=30)
  return True


# ---- launcher side ------------------------------------------------------------------------


class LaunchError(RuntimeError):
  """The launch failed: a worker exited non-zero, the deadline passed, or set-up failed."""

  def __init__(self, message: str, returncode: int = 1):
    super().__init__(message)
    self.returncode = returncode


@dataclasses.dataclass
class Result:
  """A finished launch: every worker exited 0."""
  logs: list          # Path of each worker's output
  outputs: list       # each worker's whole output (text)
  wall_s: float


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now (the namespace's loopback has all ports free)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _tail(path: Path, n: int = 4000) -> str:
  try:
    text = path.read_text(errors="replace")
  except OSError:
    return "<no output>"
  return text if len(text) <= n else "...\n" + text[-n:]


def _sh(cmd: list) -> None:
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode:
    raise LaunchError(f"`{shlex.join(cmd)}` failed ({r.returncode}): "
                      f"{(r.stderr or r.stdout).strip()}", 2)


class ShapedNamespace:
  """A fresh network namespace whose loopback is rate-limited by tc tbf (a context manager).

  burst 256 KB and latency 50 ms (the queue a sender may fill before packets drop)
  as in benchmarks/netns_collectives.py; rate None leaves the loopback unshaped.
  """

  def __init__(self, rate: str | None):
    self.rate = rate
    self.name = f"zipccl{os.getpid()}_{int(time.time() * 1000) % 100000}"

  def __enter__(self):
    if os.geteuid() != 0:
      raise LaunchError("--netns needs root (ip netns, tc)", 2)
    for tool in ("ip", "tc"):
      if shutil.which(tool) is None:
        raise LaunchError(f"--netns needs `{tool}` (iproute2) on PATH", 2)
    _sh(["ip", "netns", "add", self.name])
    try:
      _sh(["ip", "-n", self.name, "link", "set", "lo", "up"])
      if self.rate:
        _sh(["ip", "netns", "exec", self.name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
             "rate", self.rate, "burst", "256kb", "latency", "50ms"])
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def prefix(self) -> list:
    return ["ip", "netns", "exec", self.name]

  def __exit__(self, *exc):
    subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
    return False


def _cores() -> list:
  try:
    return sorted(os.sched_getaffinity(0))
  except AttributeError:  # pragma: no cover - not Linux
    return list(range(os.cpu_count() or 1))


def _echo(pipe, log_path: Path, echo: bool) -> None:
  """Copies a worker's output to its log file (and to our stdout when `echo`)."""
  with open(log_path, "wb") as log:
    for line in iter(pipe.readline, b""):
      log.write(line)
      log.flush()
      if echo:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
  pipe.close()


def launch(cmd: list, nproc: int, *, local_devices: int = 1, netns: str | None = None,
           pin: bool = False, deadline_s: float = 900, logdir: str | os.PathLike | None = None,
           env: dict | None = None, echo: bool = True, cwd: str | None = None) -> Result:
  """Runs `cmd` (e.g. [sys.executable, "examples/train_dp.py"]) as `nproc` jax.distributed workers.

  Args:
    cmd: the worker command line; every worker runs the same one.
    nproc: number of processes (>= 1).
    local_devices: CPU devices per process.
    netns: a tc rate ("1gbit", "500mbit") to run inside a shaped network
      namespace, "none" for an unshaped one, or None for this namespace.
    pin: taskset worker i to its own core; ZIPCCL_NUM_THREADS=1 unless set.
    deadline_s: wall-clock limit of the whole launch.
    logdir: where worker<i>.log go (default: a new temporary directory).
    env: extra environment variables for the workers.
    echo: stream worker 0's output to our stdout.
    cwd: the workers' working directory.

  Returns:
    A `Result` when every worker exited 0.

  Raises:
    LaunchError: with the failed worker's output (and its exit code as
      `returncode`), or naming the workers still running at the deadline.
  """
  if nproc < 1:
    raise ValueError(f"launch: nproc must be >= 1, got {nproc}")
  if local_devices < 1:
    raise ValueError(f"launch: local_devices must be >= 1, got {local_devices}")
  logdir = Path(logdir) if logdir is not None else Path(tempfile.mkdtemp(prefix="zipccl_launch"))
  logdir.mkdir(parents=True, exist_ok=True)
  logs = [logdir / f"worker{i}.log" for i in range(nproc)]
  base_env = dict(os.environ)
  base_env.pop("XLA_FLAGS", None)       # init_jax sets the device count itself
  base_env.update(env or {})
  base_env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  if pin:
    base_env.setdefault("ZIPCCL_NUM_THREADS", "1")
  cores = _cores()
  ns = ShapedNamespace(None if netns in (None, "none") else netns) if netns else None
  procs, threads = [], []
  start = time.monotonic()
  with ns or _Nothing():
    port = free_port()
    try:
      for i in range(nproc):
        wenv = dict(base_env, **{ENV_COORDINATOR: f"127.0.0.1:{port}",
                                 ENV_NUM_PROCESSES: str(nproc), ENV_PROCESS_ID: str(i),
                                 ENV_LOCAL_DEVICES: str(local_devices)})
        full = list(cmd)
        if pin:
          full = ["taskset", "-c", str(cores[i % len(cores)])] + full
        if ns:
          full = ns.prefix() + full   # `ip netns exec` execs the command: same pid
        p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=wenv,
                             cwd=cwd, start_new_session=True)
        procs.append(p)
        t = threading.Thread(target=_echo, args=(p.stdout, logs[i], echo and i == 0),
                             daemon=True)
        t.start()
        threads.append(t)
      failure = _wait(procs, start + deadline_s)
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
      for p in procs:
        try:
          p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
          pass
      for t in threads:
        t.join(timeout=10)
  if failure:   # built once the output threads are done: the logs are complete
    i, code = failure
    if code is None:
      running = [j for j, p in enumerate(procs) if p.returncode is None or p.returncode < 0]
      raise LaunchError(f"deadline of {deadline_s:g} s passed; workers {running} still "
                        f"running. Output of worker {i}:\n{_tail(logs[i])}"
                        f"\n(all worker logs: {logdir})", 124)
    raise LaunchError(f"worker {i} of {nproc} exited with code {code}; its output:\n"
                      f"{_tail(logs[i])}\n(all worker logs: {logdir})", code if code > 0 else 1)
  return Result(logs, [p.read_text(errors="replace") for p in logs], time.monotonic() - start)


class _Nothing:
  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False


def _wait(procs, deadline: float):
  """Polls the workers until all exit 0 (None), one fails ((index, exit code)) or the
  deadline passes ((index of the first one still running, None))."""
  while True:
    codes = [p.poll() for p in procs]
    dead = [i for i, c in enumerate(codes) if c not in (None, 0)]
    if dead:
      return dead[0], codes[dead[0]]
    if all(c == 0 for c in codes):
      return None
    if time.monotonic() > deadline:
      return next(i for i, c in enumerate(codes) if c is None), None
    time.sleep(0.1)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      usage="%(prog)s [-n N] [--local-devices K] [--netns RATE] [--pin] [--deadline S] "
            "[--logdir DIR] SCRIPT [ARGS...]")
  ap.add_argument("-n", "--nproc", type=int, default=2, help="processes (default 2)")
  ap.add_argument("--local-devices", type=int, default=1,
                  help="CPU devices per process (default 1)")
  ap.add_argument("--netns", metavar="RATE",
                  help="run inside a fresh network namespace, loopback shaped to RATE "
                       "(tc tbf, e.g. 1gbit; 'none': unshaped); needs root")
  ap.add_argument("--pin", action="store_true",
                  help="taskset each worker to its own core, ZIPCCL_NUM_THREADS=1")
  ap.add_argument("--deadline", type=float, default=900, metavar="S",
                  help="kill everything and fail after S seconds (default 900)")
  ap.add_argument("--logdir", help="directory for worker<i>.log (default: a temporary one)")
  ap.add_argument("--quiet", action="store_true", help="do not echo worker 0's output")
  ap.add_argument("script", help="the Python script every worker runs")
  ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
  a = ap.parse_args(argv)
  if a.nproc < 1 or a.local_devices < 1:
    ap.error("-n and --local-devices must be >= 1")
  cmd = [sys.executable, a.script] + a.args
  # A SIGTERM must still remove the namespace and the workers (the finally blocks).
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  try:
    res = launch(cmd, a.nproc, local_devices=a.local_devices, netns=a.netns, pin=a.pin,
                 deadline_s=a.deadline, logdir=a.logdir, echo=not a.quiet)
  except LaunchError as e:
    print(f"launch: {e}", file=sys.stderr)
    return e.returncode
  print(f"launch: {a.nproc} processes finished in {res.wall_s:.1f} s "
        f"(logs: {res.logs[0].parent})", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
