# The wrapper every execution runs in the sandbox's interpreter context (run.go). Daytona's
# interpreter only runs code and streams what it prints; this adds what a code interpreter shows
# besides: the value of a trailing expression, the matplotlib figures a cell made (each shown or
# still open at its end, as PNG), the execution count, and the exception with a traceback of the
# cell's own frames. Each is one line on stdout: "\x1e" + nonce + ":" + JSON, which the client
# takes out of the output.
def __ciproxy_cell(src, nonce):
    import ast, base64, io, json, linecache, os, sys, traceback, types

    g = globals()
    st = sys.modules.get("_ciproxy_state")
    if st is None:
        st = types.ModuleType("_ciproxy_state")
        st.n = 0
        sys.modules["_ciproxy_state"] = st
    st.n += 1
    out = sys.stdout
    mark = "\x1e" + nonce + ":"

    def emit(obj):
        out.write(mark + json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    def figures():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            buf = io.BytesIO()
            try:
                plt.figure(num).savefig(buf, format="png")
            except Exception:
                continue
            emit({"png": base64.b64encode(buf.getvalue()).decode("ascii")})
        plt.close("all")

    def patch():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None and not getattr(plt.show, "_ciproxy", False):
            def show(*args, **kwargs):
                figures()
            show._ciproxy = True
            plt.show = show

    def report(e, tb):
        emit({"error": {"name": type(e).__name__, "value": str(e),
                        "traceback": "".join(traceback.format_exception(type(e), e, tb))}})

    os.environ.setdefault("MPLBACKEND", "Agg")
    emit({"n": st.n})
    text = base64.b64decode(src).decode("utf-8", "replace")
    name = "<cell %d>" % st.n
    linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    try:
        tree = ast.parse(text, name, "exec")
    except SyntaxError as e:
        report(e, None)
        return
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    patch()
    try:
        exec(compile(tree, name, "exec"), g)
        if last is not None:
            value = eval(compile(last, name, "eval"), g)
            if value is not None:
                emit({"text": repr(value)})
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != name:
            tb = tb.tb_next
        report(e, tb)
    finally:
        try:
            patch()
            figures()
        except Exception:
            pass
