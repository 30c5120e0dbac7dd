"""Scripts run in processes forked from one that has already imported torch, for the tests that
run many tiny steps.

A tiny run of a step trains for about one second and spends 4-9 s of one core before that
importing torch, and from step 08 on inductor too (`torch.compile` imports it even under
TORCH_COMPILE_DISABLE=1): cProfile of `steps/10_larger_batch.py --preset tiny`, 2026-11-27. The
fast suite starts ~90 such processes. Here one server process per environment imports all that
once; each run is a fork of it, so a run costs its training, not its imports.

What a forked run shares with the server is only what the imports made: the server never runs a
tensor op (no OpenMP or intra-op thread pool exists to be copied half-way) and starts no thread
(`serve` checks). Each run gets:
- the environment it was asked for, which is the server's own: a server serves one environment
  (PYTEST_CURRENT_TEST aside), because torch and libgomp read some variables when imported
  (TORCH_COMPILE_DISABLE, OMP_NUM_THREADS);
- its script as `__main__` (runpy), sys.argv and sys.path[0] as `python SCRIPT ARGS` sets them,
  and its own working folder;
- a session of its own, so a timeout kills it and everything it started, as run_script does;
- its exit status as the shell sees it: a sys.exit code, 1 for an uncaught exception, or
  -SIGNAL where a signal ended it.

Not for a test about processes themselves (signals, start-up, stdin, malloc settings read at
exec, a compile's worker pool): those run the script with run_script, as a user does.
"""

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# what a step imports, at the server's start (its own imports of speed_ladder come with these)
PRELOAD = [
    "torch", "torch.nn.functional", "torch.utils.data", "torch.utils.checkpoint",
    "torch.distributed", "torch.distributed.fsdp", "torch.nn.parallel", "torch._dynamo",
    "torch._inductor.compile_fx", "tiktoken", "speed_ladder",
]  # fmt: skip
IGNORED = {"PYTEST_CURRENT_TEST"}  # differs per test; read by no import


def _key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in IGNORED))


class Server:
    """One preloaded server for one environment; `run` forks a run of a script off it."""

    def __init__(self, env: dict):
        self.dir = tempfile.mkdtemp(prefix="preload-")
        self.sock = os.path.join(self.dir, "s")
        # stdin: a pipe only we hold; at its EOF (this process gone, killed too) the server ends
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, start_new_session=True, text=True,
        )  # fmt: skip
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the preload server did not start: {ready!r}")

    def run(self, args, cwd, timeout: float, env: dict) -> subprocess.CompletedProcess:
        args = [str(a) for a in args]
        with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            req = {"argv": args[1:], "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(self.sock)
                conn.sendall(json.dumps(req).encode() + b"\n")  # one line; then EOF means gone
                f = conn.makefile()
                pid = int(f.readline())
                conn.settimeout(timeout)
                try:
                    line = f.readline()
                except TimeoutError:  # as subprocess's: the whole run ended, then raised
                    _kill(pid)
                    raise subprocess.TimeoutExpired(args, timeout) from None
                except BaseException:  # a test's limit, Ctrl-C: end the whole run
                    _kill(pid)
                    raise
                if not line:  # the handler died; its run may still be going
                    _kill(pid)
                    raise RuntimeError(f"the preload server lost the run of {args[1]}")
            return subprocess.CompletedProcess(
                args, int(line), out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the server's EOF: it exits
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                _kill(self.proc.pid)
                self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _kill(pid: int):
    """The run `pid` and all it started (its session); the run alone if it has none yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            pass


_SERVERS: dict[tuple, Server] = {}  # the least recently used first
_LOCK = threading.Lock()
MAX_SERVERS = 2  # ~420 MB each (VmRSS after the imports); a third closes the oldest


def run_preloaded(args, timeout: float, env: dict, cwd) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` (args[0] is sys.executable) as a fork of the server for `env`,
    started the first time that environment asks."""
    key = _key(env)
    with _LOCK:  # the ladder runs two at a time, from two threads
        server = _SERVERS.pop(key, None)
        if server is None:
            while len(_SERVERS) >= MAX_SERVERS:
                _SERVERS.pop(next(iter(_SERVERS))).close()
            server = Server(env)
        _SERVERS[key] = server
    return server.run(args, cwd, timeout, env)


@atexit.register
def close_all():
    while _SERVERS:
        _SERVERS.popitem()[1].close()


# ---- the server (this file run as a script) ----


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # sys.exit("message"), as the interpreter prints it
    return 1


def _run(req: dict):
    """In the forked run: become `python ARGV` and never return."""
    import runpy
    import traceback

    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = os.path.abspath(req["argv"][0])
    sys.argv = [req["argv"][0], *req["argv"][1:]]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # what the interpreter does at its end: wait for threads, run atexit, flush
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    os._exit(code)


def _handle(conn: socket.socket):
    """In a forked handler: fork the run, say its pid, wait, say its exit status. It ends here
    whatever happens (a client gone mid-answer is a BrokenPipeError): never back in `serve`."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        data = b""
        while not data.endswith(b"\n") and (chunk := conn.recv(1 << 16)):
            data += chunk
        req = json.loads(data)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run(req)
        conn.sendall(f"{pid}\n".encode())
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            readable, _, _ = select.select([conn], [], [], 0.05)
            if readable and not conn.recv(1):  # the client is gone (killed too): so is its run
                _kill(pid)
                os.waitpid(pid, 0)
                return
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except BaseException:
        pass
    finally:
        os._exit(0)


def serve(path: str):
    import importlib

    root = str(Path(__file__).resolve().parent.parent)  # speed_ladder, as a step finds it
    sys.path.insert(0, root)
    for name in PRELOAD:
        importlib.import_module(name)
    sys.path.remove(root)  # a run's sys.path is python's own, as its step extends it
    assert threading.active_count() == 1, "a preloaded import started a thread"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not sys.stdin.buffer.read1(1):  # our client is gone
            return
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _handle(conn)
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
