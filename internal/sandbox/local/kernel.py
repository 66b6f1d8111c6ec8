# The persistent Python kernel that runs inside a local sandbox.
#
# Protocol: requests arrive as JSON lines on fd 0 ({"id": n, "code": "..."} or
# {"id": n, "interrupt": true}); replies leave as NDJSON on fd 1 with the message types and
# field order of e2b's code-interpreter server (json.dumps with default separators), so one
# decoder reads both. Both protocol fds are moved aside at start: user code sees /dev/null on
# fd 0 and pipes on fds 1 and 2, read by threads that stream the bytes as stdout/stderr
# messages, so raw writes from subprocesses and C code are captured too.
#
# argv[1] is a JSON object of limits and options set by the launcher.

import ast
import base64
import builtins
import codecs
import datetime
import fcntl
import io
import json
import linecache
import os
import pprint
import queue
import resource
import select
import signal
import struct
import sys
import termios
import threading
import traceback

CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def _set_limit(kind, value):
    if not value:
        return
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY and value > hard:
            resource.setrlimit(kind, (hard, hard))


# Limits first, so that everything the kernel later imports or spawns is bound by them.
_set_limit(resource.RLIMIT_AS, CONFIG.get("memory"))
_set_limit(resource.RLIMIT_NPROC, CONFIG.get("processes"))
_set_limit(resource.RLIMIT_FSIZE, CONFIG.get("file_size"))
_set_limit(resource.RLIMIT_CORE, 0)

KERNEL_PID = os.getpid()
MAIN_THREAD = threading.main_thread().ident
KERNEL_FILE = os.path.abspath(__file__)

# Protocol channels, kept away from user code (non-inheritable, closed in forked children).
PROTO_IN = os.dup(0)
PROTO_OUT = os.dup(1)
_devnull = os.open(os.devnull, os.O_RDONLY)
os.dup2(_devnull, 0)
os.close(_devnull)

_write_lock = threading.Lock()


def _after_fork_in_child():
    # A forked child must never speak the protocol: it would corrupt the stream.
    for fd in (PROTO_IN, PROTO_OUT):
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)


def emit(msg):
    if os.getpid() != KERNEL_PID:
        return
    data = (json.dumps(msg) + "\n").encode("utf-8", "surrogatepass")
    # A KeyboardInterrupt must not cut a line in half: SIGINT waits while the main thread writes.
    main = threading.get_ident() == MAIN_THREAD
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _write_lock:
            view = memoryview(data)
            while view:
                n = os.write(PROTO_OUT, view)
                view = view[n:]
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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


_captures = [_Capture(1, "stdout"), _Capture(2, "stderr")]
sys.stdin = open(0, "r", closefd=False)
# Line-buffered like a terminal: a print arrives as one chunk; a partial line is flushed when the
# execution ends.
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
_requests = queue.Queue()


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
                with _state_lock:
                    if _current is not None and _current == req.get("id"):
                        signal.pthread_kill(MAIN_THREAD, signal.SIGINT)
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


def main():
    global _current
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
        try:
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


if __name__ == "__main__":
    main()
