# The persistent Python kernel that runs inside a local sandbox, and the fork server (zygote)
# that starts it.
#
# Protocol: requests arrive as JSON lines on fd 0 ({"id": n, "code": "..."} or
# {"id": n, "interrupt": true}); replies leave as NDJSON on fd 1 with the message types and
# field order of e2b's code-interpreter server (json.dumps with default separators), so one
# decoder reads both. Both protocol fds are moved aside at start: user code sees /dev/null on
# fd 0 and pipes on fds 1 and 2, read by threads that stream the bytes as stdout/stderr
# messages, so raw writes from subprocesses and C code are captured too.
#
# Two ways to run:
#   kernel.py CONFIG            a kernel on its own (no sandbox of its own; tests of the protocol)
#   kernel.py --zygote CONFIG   the fork server, inside the sandbox bubblewrap built for it: it
#                               imports the preload once, then forks one kernel per request into
#                               fresh namespaces (see _zygote below)
# CONFIG is a JSON object of limits and options set by the launcher.

import ast
import base64
import builtins
import codecs
import ctypes
import datetime
import fcntl
import io
import json
import linecache
import os
import pprint
import queue
import random
import resource
import select
import signal
import socket
import struct
import sys
import termios
import threading
import time
import traceback

CONFIG = {}


def _set_limit(kind, value):
    if not value:
        return
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY and value > hard:
            resource.setrlimit(kind, (hard, hard))


KERNEL_FILE = os.path.abspath(__file__)
# Set by _setup_protocol in the kernel process.
KERNEL_PID = None
MAIN_THREAD = None
# Protocol channels, kept away from user code (non-inheritable, closed in forked children).
PROTO_IN = None
PROTO_OUT = None
_captures = []

_write_lock = threading.Lock()


def _after_fork_in_child():
    # A forked child must never speak the protocol: it would corrupt the stream.
    for fd in (PROTO_IN, PROTO_OUT):
        try:
            os.close(fd)
        except OSError:
            pass


def emit(msg):
    if os.getpid() != KERNEL_PID:
        return
    data = (json.dumps(msg) + "\n").encode("utf-8", "surrogatepass")
    # A KeyboardInterrupt must not cut a line in half: SIGINT waits while the main thread writes.
    main = threading.get_ident() == MAIN_THREAD
    if main:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _write_lock:
            view = memoryview(data)
            while view:
                n = os.write(PROTO_OUT, view)
                view = view[n:]
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _timestamp():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


class _Capture:
    """Reads one of the user-facing fds (1 or 2) through a pipe and emits its chunks."""

    def __init__(self, fd, kind):
        self.kind = kind
        self.busy = False
        self.lock = threading.Lock()
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.r = r
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            select.select([self.r], [], [])
            with self.lock:
                self.busy = True
            try:
                data = os.read(self.r, 65536)
                if not data:
                    return
                text = self.decoder.decode(data)
                if text:
                    emit({"type": self.kind, "text": text, "timestamp": _timestamp()})
            finally:
                with self.lock:
                    self.busy = False

    def idle(self):
        with self.lock:
            if self.busy:
                return False
            buf = bytearray(4)
            fcntl.ioctl(self.r, termios.FIONREAD, buf)
            return struct.unpack("i", bytes(buf))[0] == 0


def _setup_protocol():
    """Moves the protocol off fds 0 and 1 and captures what user code writes to fds 1 and 2."""
    global KERNEL_PID, MAIN_THREAD, PROTO_IN, PROTO_OUT, _captures
    KERNEL_PID = os.getpid()
    MAIN_THREAD = threading.main_thread().ident
    PROTO_IN = os.dup(0)
    PROTO_OUT = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _captures = [_Capture(1, "stdout"), _Capture(2, "stderr")]
    sys.stdin = open(0, "r", closefd=False)
    # Line-buffered like a terminal: a print arrives as one chunk; a partial line is flushed when
    # the execution ends.
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin


def _drain_output():
    """Waits until everything user code wrote to fds 1 and 2 has been emitted."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    for _ in range(2000):
        if all(c.idle() for c in _captures):
            return
        select.select([], [], [], 0.0005)


# --- execution --------------------------------------------------------------------------------

_state_lock = threading.Lock()
_current = None  # id of the running execution
# Ids of interrupts that arrived before their execution started. A shell request among them is
# not run at all: its caller is gone, and an interrupt it never got would let it run to its end.
_early = set()
_requests = queue.Queue()

# Interrupts. A SIGINT that arrives after the interpreter last looked for signals and before a
# blocking call starts (time.sleep, a lock, a read; on a loaded host the main thread is easily
# preempted just there) runs the C handler and interrupts nothing: the Python handler waits until
# that call returns on its own, a minute later for time.sleep(60). So after the SIGINT, the main
# thread is woken every _WAKE_EVERY by a signal whose handler does nothing, until the user's code
# is over: the woken call fails with EINTR and the interpreter runs the queued SIGINT handler
# before it would retry. A wake after the KeyboardInterrupt only makes a call retry, where a
# second SIGINT could land in the user's own except clause. SIGINT keeps Python's own handler
# (asyncio.run and others look for it).
_WAKE_SIGNAL = signal.SIGRTMIN + 4
_WAKE_EVERY = 0.02  # seconds
# The host kills the sandbox when the code has not stopped 3 s after the interrupt.
_WAKE_FOR = 5.0


def _interrupt(exec_id):
    """Interrupts execution exec_id if it is the running one."""
    with _state_lock:
        if _current is None or _current != exec_id:
            if isinstance(exec_id, int):
                _early.add(exec_id)  # perhaps one still queued (see serve)
            return
        signal.pthread_kill(MAIN_THREAD, signal.SIGINT)
    try:
        threading.Thread(target=_wake, args=(exec_id,), daemon=True).start()
    except Exception:
        pass  # no thread to be had (RLIMIT_NPROC, memory): the SIGINT alone must do


def _on_wake(signum, frame):
    pass


def _wake(exec_id):
    for _ in range(int(_WAKE_FOR / _WAKE_EVERY)):
        select.select([], [], [], _WAKE_EVERY)
        with _state_lock:
            # Code that reset the signal (to its default action, which ends the process) gets
            # no more wakes.
            if _current != exec_id or signal.getsignal(_WAKE_SIGNAL) is not _on_wake:
                return
            signal.pthread_kill(MAIN_THREAD, _WAKE_SIGNAL)


def _reader():
    buf = b""
    while True:
        chunk = os.read(PROTO_IN, 65536)
        if not chunk:
            _requests.put(None)
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except ValueError:
                continue
            if req.get("interrupt"):
                _interrupt(req.get("id"))
                continue
            _requests.put(req)


def _strip_quotes(text):
    # e2b strips one pair of surrounding quotes from text/plain.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


_MIME_METHODS = (
    ("html", "_repr_html_"),
    ("markdown", "_repr_markdown_"),
    ("svg", "_repr_svg_"),
    ("png", "_repr_png_"),
    ("jpeg", "_repr_jpeg_"),
    ("latex", "_repr_latex_"),
    ("json", "_repr_json_"),
    ("javascript", "_repr_javascript_"),
)


def _plain(value):
    if type(value) in (list, dict, tuple, set, frozenset):
        return pprint.pformat(value, width=79, sort_dicts=False)
    return repr(value)


def _result(value, main):
    """A result message for value in e2b's field order (text, html, ..., extra, is_main_result)."""
    fields = {"text": _strip_quotes(_plain(value))}
    if not isinstance(value, type):
        for key, meth in _MIME_METHODS:
            fn = getattr(value, meth, None)
            if not callable(fn):
                continue
            try:
                data = fn()
            except Exception:
                continue
            if data is None:
                continue
            if isinstance(data, tuple):
                data = data[0]
            if key in ("png", "jpeg") and isinstance(data, (bytes, bytearray)):
                data = base64.b64encode(data).decode("ascii")
            if key == "json" and not isinstance(data, dict):
                continue
            fields[key] = data
    msg = {"type": "result"}
    for key in ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json",
                "javascript", "data", "chart"):
        if key in fields:
            msg[key] = fields[key]
    msg["extra"] = {}
    msg["is_main_result"] = main
    return msg


def _figure_result(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return {"type": "result", "text": repr(fig),
            "png": base64.b64encode(buf.getvalue()).decode("ascii"),
            "extra": {}, "is_main_result": False}


def _flush_figures():
    """Emits every open matplotlib figure as a png result and closes them (as Jupyter's inline
    backend does after a cell or on plt.show())."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = plt.get_fignums()
    except Exception:
        return
    for num in nums:
        try:
            fig = plt.figure(num)
            msg = _figure_result(fig)
        except Exception:
            continue
        _drain_output()
        emit(msg)
    try:
        plt.close("all")
    except Exception:
        pass


def display(*objs, **kwargs):
    """Shows objects as rich results, like IPython's display()."""
    _drain_output()
    for obj in objs:
        emit(_result(obj, False))


def _show(*args, **kwargs):
    _flush_figures()


def _error(exc, cell):
    """An error message with a traceback whose frames from this file are removed."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == KERNEL_FILE:
        tb = tb.tb_next
    exc = exc.with_traceback(tb)
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": text}


_count = 0
_user_ns = {"__name__": "__main__", "__builtins__": builtins, "display": display}


def _execute(code):
    global _count
    _count += 1
    emit({"type": "number_of_executions", "execution_count": _count})
    cell = "Cell In[%d]" % _count
    linecache.cache[cell] = (len(code), None, code.splitlines(True), cell)
    error = None
    main = None
    has_main = False
    try:
        tree = ast.parse(code, cell, "exec")
    except (SyntaxError, ValueError) as exc:
        emit({"type": "error", "name": type(exc).__name__, "value": str(exc),
              "traceback": "".join(traceback.format_exception_only(type(exc), exc))})
        return
    try:
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = tree.body.pop()
        exec(compile(tree, cell, "exec"), _user_ns)
        if last is not None:
            expr = ast.Expression(last.value)
            main = eval(compile(expr, cell, "eval"), _user_ns)
            has_main = main is not None
            if has_main:
                _user_ns["_"] = main
    except BaseException as exc:  # KeyboardInterrupt and SystemExit included, as in Jupyter
        if os.getpid() != KERNEL_PID:
            os._exit(1)
        error = _error(exc, cell)
    _user_code_done()
    if os.getpid() != KERNEL_PID:
        # A child forked by user code that fell through: it must not answer.
        os._exit(0)
    _drain_output()
    if has_main:
        try:
            emit(_result(main, True))
        except Exception as exc:
            error = error or _error(exc, cell)
    _flush_figures()
    _drain_output()
    if error is not None:
        emit(error)


# --- shell commands (the hosted shell tool) -----------------------------------------------------
#
# A shell request ({"id": n, "shell": "<command>", "env": [...], "timeout": seconds}) runs
# `bash -c <command>` beside the kernel, not in it: the kernel's Python state is untouched. Each
# kernel forks a shell server (S) when it starts, before any user code runs, so that S shares the
# template's pages and holds nothing of the code's memory; S is a child subreaper and spawns each
# command as the leader of a session of its own, so everything the command starts, however it
# detaches (&, setsid, a double fork), stays below S. When the shell exits, the timeout passes,
# or the kernel asks (an interrupt) or goes away, S kills the shell's session and every process
# left below it, and reports the shell's status once none is left. The kernel streams the two
# output pipes meanwhile (shell_stdout / shell_stderr messages, decoded incrementally) and ends
# with shell_exit {exit_code, timed_out}. S and the command have the kernel's namespaces,
# identity, limits and seccomp filter.
#
# Kernel and S speak over a SOCK_SEQPACKET pair: the kernel sends {"env", "timeout"} with the
# command's stdout, stderr and a pipe carrying the command text; S answers {"pid"} once the shell
# runs and {"exit_code", "timed_out"} at the end. Any other message from the kernel during a
# command means "stop it"; the pair's end means the kernel is gone.

_PR_SET_CHILD_SUBREAPER = 36
_SHELLS = ("/bin/bash", "/bin/sh")
_shell_sock = None  # the kernel's end of its shell server's socket
_shell_pid = 0  # the server's pid, reaped once it is found dead


def _start_shell_server():
    """Forks S and keeps the kernel's end of its socket (None when no process can be had)."""
    global _shell_sock, _shell_pid
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        try:
            ours.close()
            _shell_server(theirs)
        finally:
            os._exit(1)
    theirs.close()
    _shell_sock, _shell_pid = ours, pid


def _shell_server(sock):
    """S: serves commands one at a time until the kernel's end of sock closes. Never returns."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    libc = _libc or ctypes.CDLL(None, use_errno=True)
    _sys(libc.prctl(ctypes.c_int(_PR_SET_CHILD_SUBREAPER), ctypes.c_ulong(1), ctypes.c_ulong(0),
                    ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl subreaper")
    shell = next((s for s in _SHELLS if os.access(s, os.X_OK)), _SHELLS[-1])
    reset = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGCHLD, _WAKE_SIGNAL)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:
            _kill_below(0)
            os._exit(0)
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue  # a late "stop" for a command that is over
        out_w, err_w, cmd_r = fds
        status, timed_out = 126, False
        try:
            req = json.loads(msg)
            command = b""
            while True:
                piece = os.read(cmd_r, 65536)
                if not piece:
                    break
                command += piece
            env = [str(e) for e in req.get("env") or []]
            pid = os.posix_spawn(shell, [os.path.basename(shell), "-c", command.decode("utf-8", "surrogateescape")],
                                 dict(zip(env[0::2], env[1::2])),
                                 file_actions=[(os.POSIX_SPAWN_DUP2, out_w, 1),
                                               (os.POSIX_SPAWN_DUP2, err_w, 2)],
                                 setsid=True, setsigmask=(), setsigdef=reset)
        except Exception as exc:
            try:
                os.write(err_w, ("shell: %s\n" % exc).encode())
            except OSError:
                pass
            pid = 0
        for fd in fds:
            os.close(fd)
        if pid:
            sock.send(json.dumps({"pid": pid}).encode())
            status, timed_out = _wait_command(sock, pid, float(req.get("timeout") or 0))
        _kill_below(pid)
        sock.send(json.dumps({"exit_code": status, "timed_out": timed_out}).encode())


def _wait_command(sock, pid, timeout):
    """Waits for the shell pid; returns (status, timed out). A stop message or the kernel's end
    cuts it short (status 128+SIGKILL), as does the timeout."""
    pidfd = os.pidfd_open(pid)
    try:
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([pidfd, sock], [], [], wait)
            if pidfd in ready:
                _, st = os.waitpid(pid, 0)
                code = os.waitstatus_to_exitcode(st)
                return (128 - code if code < 0 else code), False
            if sock in ready:
                try:
                    msg = sock.recv(1 << 16)
                except OSError:
                    msg = b""
                if not msg:
                    _kill_below(pid)
                    os._exit(0)  # the kernel is gone
                return 128 + signal.SIGKILL, False
            if deadline is not None and time.monotonic() >= deadline:
                return 128 + signal.SIGKILL, True
            _reap()
    finally:
        os.close(pidfd)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_below(session):
    """Kills the shell's session and every process below this one until none is left."""
    me = str(os.getpid())
    while True:
        if session:
            try:
                os.killpg(session, signal.SIGKILL)
            except OSError:
                pass
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[1].decode() == me:  # the parent pid
                try:
                    os.kill(int(name), signal.SIGKILL)
                except OSError:
                    pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            pass


def _run_shell(req):
    """Runs one shell request from the kernel's main thread (see above). A server found dead
    before it started the command (the code killed it) is replaced once."""
    global _shell_sock
    for _ in range(2):
        if _shell_sock is None:
            _start_shell_server()
        if _shell_sock is None:
            break
        result = _shell_attempt(req, _shell_sock)
        if result is not None:
            emit({"type": "shell_exit", "exit_code": int(result.get("exit_code", 126)),
                  "timed_out": bool(result.get("timed_out"))})
            return
        _shell_sock.close()
        _shell_sock = None
        _reap_server()
    emit({"type": "shell_stderr", "text": "shell: no process could be started\n"})
    emit({"type": "shell_exit", "exit_code": 126, "timed_out": False})


def _reap_server():
    global _shell_pid
    if _shell_pid:
        try:
            os.waitpid(_shell_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        _shell_pid = 0


def _shell_attempt(req, sock):
    """Runs the command through the server on sock and streams its output; returns the
    server's result, or None when the server was gone before it started the command."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    cmd_r, cmd_w = os.pipe()
    head = json.dumps({"env": req.get("env") or [], "timeout": req.get("timeout") or 0}).encode()
    try:
        socket.send_fds(sock, [head], [out_w, err_w, cmd_r])
        sent = True
    except OSError:
        sent = False
    for fd in (out_w, err_w, cmd_r):
        os.close(fd)
    if not sent:
        for fd in (out_r, err_r, cmd_w):
            os.close(fd)
        return None
    # The command text goes through a pipe (it may be longer than a socket message); a thread
    # writes it so that a command that never reads it cannot block the kernel.
    command = str(req.get("shell", "")).encode("utf-8", "surrogatepass")

    def feed():
        try:
            view = memoryview(command)
            while view:
                view = view[os.write(cmd_w, view):]
        except OSError:
            pass
        finally:
            os.close(cmd_w)

    threading.Thread(target=feed, daemon=True).start()
    pipes = {out_r: ("shell_stdout", codecs.getincrementaldecoder("utf-8")("replace")),
             err_r: ("shell_stderr", codecs.getincrementaldecoder("utf-8")("replace"))}
    pid, result, stopped, gone = 0, None, False, False
    while pipes or (result is None and not gone):
        try:
            # SIGINT is blocked but here (see _run_shell): an interrupt lands in this try.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            try:
                ready, _, _ = select.select(list(pipes) + ([sock] if result is None and not gone else []), [], [])
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            for fd in ready:
                if fd is sock:
                    try:
                        msg = sock.recv(1 << 16)
                    except OSError:  # ECONNRESET: the server died with the request unread
                        msg = b""
                    if not msg:
                        gone = True
                        if pid:  # it died during the command: what it can still reach goes too
                            try:
                                os.killpg(pid, signal.SIGKILL)
                            except OSError:
                                pass
                        continue
                    m = json.loads(msg)
                    if "pid" in m:
                        pid = m["pid"]
                    else:
                        result = m
                    continue
                kind, dec = pipes[fd]
                data = os.read(fd, 65536)
                text = dec.decode(data, final=not data)
                if text:
                    emit({"type": kind, "text": text})
                if not data:
                    os.close(fd)
                    del pipes[fd]
        except KeyboardInterrupt:
            # The proxy's interrupt: the server kills the command, and the pipes reach EOF.
            # Later interrupts have nothing more to stop.
            _user_code_done()
            if not stopped and result is None and not gone:
                stopped = True
                try:
                    sock.send(b"stop")
                except OSError:
                    pass
    if result is None and gone and pid:
        result = {"exit_code": 128 + signal.SIGKILL, "timed_out": False}
    return result


def _preload():
    for name in CONFIG.get("preload", []):
        try:
            __import__(name)
        except BaseException:
            pass
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.show = _show


def _user_code_done():
    """Interrupts stop user code only, not the reporting of its results."""
    global _current
    with _state_lock:
        _current = None


def _next_request():
    while True:
        try:
            return _requests.get()
        except KeyboardInterrupt:
            continue


def _user_site():
    """Puts the directory that pip install --user fills (under PYTHONUSERBASE) on sys.path, made
    now: the import system rereads a directory on the path whose mtime changed, so a package
    installed later imports at once, but it never looks again at one that did not exist."""
    base = os.environ.get("PYTHONUSERBASE")
    if not base:
        return
    path = os.path.join(base, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if path not in sys.path:
        sys.path.append(path)


def serve():
    """Runs the kernel on fds 0 and 1 until its requests end."""
    global _current
    _start_shell_server()  # first: no thread, no user code, nothing of either in S
    _user_site()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(_WAKE_SIGNAL, _on_wake)
    _setup_protocol()
    if CONFIG.get("preload"):
        _preload()
        _drain_output()
    threading.Thread(target=_reader, daemon=True).start()
    emit({"type": "ready"})
    while True:
        req = _next_request()
        if req is None:
            os._exit(0)
        with _state_lock:
            _current = req.get("id")
            early = _current in _early
            _early.difference_update([i for i in _early if not isinstance(_current, int) or i <= _current])
        try:
            if "shell" in req and early:
                emit({"type": "shell_exit", "exit_code": 128 + signal.SIGKILL, "timed_out": False})
            elif "shell" in req:
                # An interrupt may stop a command only while the kernel waits for its output
                # (_shell_attempt): anywhere else it would leave the server's answers unread.
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                try:
                    _run_shell(req)
                except Exception as exc:  # never the kernel's end
                    emit({"type": "shell_stderr", "text": "shell: %s\n" % exc})
                    emit({"type": "shell_exit", "exit_code": 126, "timed_out": False})
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            else:
                _execute(str(req.get("code", "")))
        except KeyboardInterrupt:
            # An interrupt that landed outside user code: the execution is over anyway.
            pass
        finally:
            with _state_lock:
                _current = None
        while True:
            try:
                emit({"type": "end_of_execution"})
                break
            except KeyboardInterrupt:
                continue


def _direct(cfg):
    """A kernel on its own: limits first, so that everything it imports or spawns is bound."""
    CONFIG.update(cfg)
    _set_limit(resource.RLIMIT_AS, CONFIG.get("memory"))
    _set_limit(resource.RLIMIT_NPROC, CONFIG.get("processes"))
    _set_limit(resource.RLIMIT_FSIZE, CONFIG.get("file_size"))
    _set_limit(resource.RLIMIT_CORE, 0)
    serve()


# --- the fork server -----------------------------------------------------------------------------
#
# The zygote runs inside a bubblewrap sandbox of its own: its own mount namespace with the minimal
# read-only view every sandbox gets, and its own pid, network, IPC and UTS namespaces. When the
# proxy runs as root, the zygote is root of the host's user namespace holding only the
# capabilities that building a sandbox takes (SYS_ADMIN, NET_ADMIN, SETUID, SETGID, SETPCAP;
# zygote.go says which step needs which), permitted but none effective between spawns, and no
# other in its bounding set; each is dropped in C, I or K once its step is done. Otherwise it is
# root of a user namespace that maps the proxy's uid alone. Bubblewrap has
# installed the zygote's seccomp filter (the kernels' one plus what forking a sandbox needs:
# unshare, mount, sethostname), which refuses the rest of what those capabilities could do
# (setns, bpf, modules, keyrings...). It never runs user code.
#
# It imports the preload once, then reads spawn requests from the proxy on fd 3 (a SOCK_SEQPACKET
# socket; each request is JSON with four descriptors: the kernel's stdin, stdout and stderr pipes
# and a setup socket). For each it forks:
#   C  unshares mount, UTS, IPC, network and pid namespaces; mounts size-capped tmpfs on
#      /mnt/data (owned by the sandbox's uid), /tmp and /dev/shm and a new devpts; sets the
#      hostname; brings up lo; drops NET_ADMIN; forks I and exits.
#   I  pid 1 of the new pid namespace: mounts its /proc, sends the proxy a pidfd of itself over
#      the setup socket, waits for "go" (the proxy has put it into the sandbox's cgroups), then
#      unshares a cgroup namespace rooted there, drops SYS_ADMIN, forks K, sends the proxy a
#      pidfd of K and drops every capability. It reaps
#      orphans, and exits when K exits or the proxy closes the setup socket; as the namespace's
#      init its exit kills every process of the sandbox, however it was forked.
#   K  the kernel: becomes the sandbox's own host uid and, as that uid, creates a user namespace
#      in which it is uid 1000 and which allows no further one (the kernel's per-user counts, such
#      as inotify instances, are thus the sandbox's own all the way up to the host's namespace;
#      the sandbox's other namespaces belong to the host's, so it has no capability over them);
#      drops every capability, sets its rlimits, moves to /mnt/data, installs the kernels' seccomp
#      filter and becomes the template of the sandbox's kernels: it forks W, which reseeds the
#      random generators and serves the protocol, and on the proxy's restart (SIGUSR1) replaces
#      W by a fresh one (_template).
#
# What every kernel shares with its siblings, and why that is safe:
#   - Memory pages of the zygote (the interpreter, the imported modules, their caches), mapped
#     copy-on-write: a write by one kernel copies the page into that kernel alone (and is charged
#     to its cgroup), so no kernel can change what another sees.
#   - The state of the imported modules as the zygote left it: the zygote has never run user code,
#     has no tenant's data, and was started with an empty environment, so there is nothing secret
#     in it.
#   - The address-space layout (ASLR), the stack protector's canary and Python's hash seed (which
#     cannot change once the interpreter runs): they would matter only to an attacker who could
#     feed input to another tenant's kernel, which no tenant can (separate namespaces, uids and
#     pipes). Random generators that user code reads (random, numpy.random) are reseeded from the
#     kernel's entropy in every kernel; os.urandom and secrets read the kernel directly.

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 4, 24, 38, 22
_SECCOMP_MODE_FILTER = 2
_libc = None


def _sys(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def _b(s):
    return None if s is None else s.encode()


def _unshare(flags):
    _sys(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _mount(source, target, fstype, flags, data=None):
    _sys(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
         "mount " + target)


def _prctl(option, arg):
    _sys(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                     ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl %d" % option)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_cap_last = None
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_zygote_caps = 0  # the zygote's permitted capabilities, as a mask


def _capabilities():
    """The permitted set, as a mask."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _sys(_libc.capget(ctypes.byref(header), data), "capget")
    return data[0].permitted | data[1].permitted << 32


def _set_capabilities(effective, permitted):
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    for i in (0, 1):
        data[i].effective = effective >> (32 * i) & 0xFFFFFFFF
        data[i].permitted = permitted >> (32 * i) & 0xFFFFFFFF
    _sys(_libc.capset(ctypes.byref(header), data), "capset")


def _drop_capabilities(keep=0):
    """Drops every capability not in the mask keep, from the bounding set first (which takes
    SETPCAP, so it goes before the permitted set) and then from the permitted and effective sets:
    nothing forked or executed later can regain them."""
    for cap in range(_cap_last + 1):
        if not keep >> cap & 1:
            _prctl(_PR_CAPBSET_DROP, cap)
    _set_capabilities(keep, keep)


def _install_seccomp(program):
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _sys(_libc.prctl(ctypes.c_int(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER),
                     ctypes.byref(prog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


def _write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise OSError(exc.errno, "writing %s: %s" % (path, exc.strerror)) from None


def _loopback_up():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, ifr))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    finally:
        s.close()


def _vm_size():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _warm_up():
    """Runs once in the zygote what a kernel's first cells would otherwise pay for."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            fig = plt.figure()
            fig.gca().plot([1, 2])
            fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
            plt.close("all")
        except Exception:
            pass
    pd = sys.modules.get("pandas")
    if pd is not None:
        try:
            pd.DataFrame({"a": [1]})._repr_html_()
        except Exception:
            pass
    _result(1, True)


def _report(sock, msg, fds=()):
    socket.send_fds(sock, [json.dumps(msg).encode()], list(fds))


def _failure(exc):
    """What went wrong in the fork server's children, with the line it went wrong at."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = (" (at %s)" % tb[-1].line) if tb else ""
    return {"type": "error", "message": "%s: %s%s" % (type(exc).__name__, exc, where)}


def _zygote(cfg):
    global _libc, _cap_last, _zygote_caps
    CONFIG.update(cfg)
    _libc = ctypes.CDLL(None, use_errno=True)
    _cap_last = int(open("/proc/sys/kernel/cap_last_cap").read())
    with open(CONFIG["seccomp"], "rb") as f:
        code_filter = f.read()
    ctl = socket.socket(fileno=3)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    _preload()
    _warm_up()
    # Bubblewrap left the bounding set full: as uid 0, an execve would regain every capability.
    # Keep only the permitted ones there, and between spawns none effective: reading and parsing
    # requests takes none, and each fork raises them again for itself (_child).
    _zygote_caps = _capabilities()
    _drop_capabilities(_zygote_caps)
    _set_capabilities(0, _zygote_caps)
    # Forked children (C) exit at once; nobody waits for them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _report(ctl, {"type": "ready", "threads": len(os.listdir("/proc/self/task"))})
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 8)
        except InterruptedError:
            continue
        if not msg:
            os._exit(0)  # the proxy is gone
        try:
            _spawn(json.loads(msg), fds, code_filter, ctl)
        except Exception:
            pass
        for fd in fds:
            os.close(fd)


def _spawn(req, fds, code_filter, ctl):
    if len(fds) != 4:
        return
    if len(os.listdir("/proc/self/task")) != 1:
        # fork() copies only the calling thread: locks held by another would stay locked.
        _report(socket.socket(fileno=os.dup(fds[3])), {"type": "error", "message": "the fork server has threads"})
        return
    try:
        pid = os.fork()
    except OSError as exc:
        _report(socket.socket(fileno=os.dup(fds[3])), {"type": "error", "message": "fork: %s" % exc})
        return
    if pid != 0:
        return
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctl.close()
        _child(req, fds, code_filter)
    except BaseException as exc:
        try:
            _report(socket.socket(fileno=fds[3]), _failure(exc))
        finally:
            os._exit(1)
    os._exit(0)


def _child(req, fds, code_filter):
    """C: the sandbox's namespaces and filesystems, then its init."""
    uid = int(req["uid"])
    _set_capabilities(_zygote_caps, _zygote_caps)
    _unshare(_CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWIPC | _CLONE_NEWNET | _CLONE_NEWPID)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    tmpfs = _MS_NOSUID | _MS_NODEV
    _mount("tmpfs", "/mnt/data", "tmpfs", tmpfs, "size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d" % (
        req["data_size"], req["data_inodes"], uid, uid))
    _mount("tmpfs", "/tmp", "tmpfs", tmpfs, "size=%d,nr_inodes=%d,mode=1777" % (
        req["tmp_size"], req["tmp_inodes"]))
    _mount("tmpfs", "/dev/shm", "tmpfs", tmpfs | _MS_NOEXEC, "size=%d,nr_inodes=%d,mode=1777" % (
        req["shm_size"], req["tmp_inodes"]))
    _mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    _sys(_libc.sethostname(b"sandbox", 7), "sethostname")
    _loopback_up()
    # NET_ADMIN was for lo alone: neither I nor K gets it.
    _drop_capabilities(_zygote_caps & ~(1 << _CAP_NET_ADMIN))
    # The sandbox's only way out: a listener on its own loopback whose connections the proxy
    # accepts (its egress proxy), made here, before any code of the sandbox runs, so that the
    # address is the proxy's; the init hands it over and keeps no copy.
    egress = None
    if req.get("egress_port"):
        egress = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        egress.bind(("127.0.0.1", int(req["egress_port"])))
        egress.listen(128)
    if os.fork() == 0:
        try:
            _init(req, fds, code_filter, egress)
        except BaseException as exc:
            try:
                _report(socket.socket(fileno=fds[3]), _failure(exc))
            finally:
                os._exit(1)


def _init(req, fds, code_filter, egress):
    """I: pid 1 of the sandbox."""
    setup = socket.socket(fileno=fds[3])
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    pidfd = os.pidfd_open(os.getpid())
    _report(setup, {"type": "started"}, [pidfd] + ([egress.fileno()] if egress else []))
    os.close(pidfd)
    if egress:
        egress.close()
    if setup.recv(16) != b"go":
        os._exit(1)
    _unshare(_CLONE_NEWCGROUP)
    # SYS_ADMIN was for the mounts and namespaces, all made: K starts without it, holding only
    # what becoming the sandbox's uid takes (SETUID, SETGID) and SETPCAP to drop the rest.
    _drop_capabilities(_capabilities() & ~(1 << _CAP_SYS_ADMIN))
    kernel = os.fork()
    if kernel == 0:
        setup.close()
        _kernel(req, fds, code_filter)
        os._exit(1)
    # The proxy restarts an idle kernel through K (see _template).
    kfd = os.pidfd_open(kernel)
    _report(setup, {"type": "kernel"}, [kfd])
    os.close(kfd)
    for fd in fds[:3]:
        os.close(fd)
    _drop_capabilities()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([setup, wake_r], [], [])
        if setup in ready and not setup.recv(16):
            os._exit(0)  # the proxy is gone or deleted the sandbox
        if wake_r in ready:
            os.read(wake_r, 512)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == 0:
                break
            if pid == kernel:
                os._exit(0)


def _kernel(req, fds, code_filter):
    """K: the sandbox's identity, limits and filter, then the kernel itself."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python's own startup does
    uid = int(req["uid"])
    if uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # leaving uid 0 clears the permitted and effective sets
    # A changed identity makes the process undumpable, and its /proc files root's: they must be
    # its own to write its user namespace's maps.
    _prctl(_PR_SET_DUMPABLE, 1)
    outer_uid, outer_gid = os.geteuid(), os.getegid()
    _unshare(_CLONE_NEWUSER)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", "1000 %d 1\n" % outer_uid)
    _write("/proc/self/gid_map", "1000 %d 1\n" % outer_gid)
    _write("/proc/sys/user/max_user_namespaces", "0")
    _drop_capabilities()
    vm = _vm_size()
    memory = int(req.get("memory") or 0)
    if memory:
        # Address space: what the zygote mapped plus the limit, so that one huge allocation is a
        # MemoryError; the aggregate over all processes is the cgroup's business (see local.go).
        _set_limit(resource.RLIMIT_AS, vm + memory)
    # Two more processes than the code's own: the template (_template) below and the kernel's
    # shell server (_shell_server).
    _set_limit(resource.RLIMIT_NPROC, req.get("processes") and req["processes"] + 2)
    _set_limit(resource.RLIMIT_FSIZE, req.get("file_size"))
    _set_limit(resource.RLIMIT_NOFILE, req.get("open_files"))
    _set_limit(resource.RLIMIT_CORE, 0)
    os.chdir("/mnt/data")
    for i, fd in enumerate(fds[:3]):
        os.dup2(fd, i)
    os.closerange(3, 1 << 16)
    if req.get("seccomp", True):
        _install_seccomp(code_filter)
    CONFIG.pop("preload", None)
    _template()


def _template():
    """K, once set up: the template of the sandbox's kernels. It forks the kernel that serves (W)
    and never runs code itself, so that its pages stay the zygote's, shared copy-on-write. On
    SIGUSR1 (the proxy's restart of an idle kernel, through the pidfd the init gave it) it kills
    W and every other process of the sandbox but the init, and forks a fresh W: the memory of the
    Python state is released, /mnt/data, /tmp and /dev/shm stay (they are the sandbox's mounts).
    When W ends on its own, K ends with it, and so does the sandbox, as a kernel's exit always did.
    User code can send SIGUSR1 too: it restarts its own kernel, nothing more.

    K takes its two signals synchronously (sigwaitinfo, both blocked): no handler runs between
    bytecodes, so a signal can never be taken by the C handler and then wait, unacted on, behind a
    blocking call, and one that arrives while K restarts is kept pending for the next W."""
    signals = {signal.SIGUSR1, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    while True:
        worker = os.fork()
        if worker == 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
            random.seed()
            np = sys.modules.get("numpy")
            if np is not None:
                np.random.seed()
            serve()
            os._exit(1)
        restart = False
        while True:
            if signal.sigwaitinfo(signals).si_signo == signal.SIGUSR1:
                if not restart:
                    restart = True
                    try:
                        os.kill(worker, signal.SIGKILL)
                    except OSError:
                        pass
            elif os.waitpid(worker, os.WNOHANG)[0]:
                break  # SIGCHLD: W ended (a stop or a continue leaves it listed)
        if not restart:
            os._exit(0)
        _end_others()


def _end_others():
    """Kills every process of the sandbox but the init and this one, and waits until they are
    gone (the init reaps them), so that their memory is free before the next kernel starts."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    me = os.getpid()
    for _ in range(2000):
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]:
            return
        select.select([], [], [], 0.001)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--zygote":
        _zygote(json.loads(sys.argv[2]))
    else:
        _direct(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
