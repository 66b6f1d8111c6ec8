# The interpreter contexts of the emulated daemon, inside the exec sandbox's kernel (run once at
# start). Each context is a globals dict in which code is exec'd, as the daemon's repl worker
# does in its own python3 process: no value of a trailing expression, no rich output, only what
# is printed. An exception ends the cell as DtnFailure whose value is the daemon's error message
# (name, value, a traceback of the submitted code's frames only), which the Go side unpacks.
def __dtn_setup():
    import base64, builtins, json, os, sys, traceback

    try:
        import matplotlib.pyplot as plt
        plt.show = lambda *args, **kwargs: None  # plain python3 with Agg: show() shows nothing
    except Exception:
        pass
    contexts = {}

    class DtnFailure(Exception):
        pass

    def run(cid, cwd, code_b64, envs_json):
        g = contexts.setdefault(cid, {"__name__": "__main__", "__builtins__": builtins})
        code = base64.b64decode(code_b64).decode("utf-8")
        envs = json.loads(envs_json)
        saved = {k: os.environ.get(k) for k in envs}
        os.environ.update(envs)
        try:
            os.chdir(cwd)
        except OSError:
            pass
        try:
            exec(compile(code, "<stdin>", "exec"), g)
        except BaseException as e:
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != "<stdin>":
                tb = tb.tb_next
            raise DtnFailure(json.dumps({"name": type(e).__name__, "value": str(e),
                                         "traceback": "".join(traceback.format_exception(type(e), e, tb))}))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            sys.stdout.flush()
            sys.stderr.flush()

    def drop(cid):
        contexts.pop(cid, None)

    return run, drop, os.getcwd()


__dtn_run, __dtn_drop, __dtn_home = __dtn_setup()
del __dtn_setup
print(__dtn_home)
