# Run once in each new Python code context (run.go), before any code of the model's. execd drops
# the kernel's display_data, so figures shown with plt.show() or left open at the end of a cell
# would never arrive: an IPython post_execute hook, registered before pyplot is imported (IPython
# runs its callbacks in registration order), prints every open figure as a PNG between markers on
# stdout and closes it; the client turns those into image outputs. pyplot runs on Agg, and
# plt.show() keeps the figures open for the hook. The hook also prints a marker at the end of
# every cell: a cell that completes without it ran in a kernel that died (its state is lost).
# execd's access token is removed from the kernel's environment.
def __ciproxy_prepare():
    import base64, io, os, sys, warnings

    # execd's token came in the sandbox's environment: the code and its commands need it not.
    os.environ.pop("EXECD_ACCESS_TOKEN", None)
    os.environ.setdefault("MPLBACKEND", "Agg")
    begin, end, done = "\x1e\x1fciproxy-figure ", "\x1e\n", "\x1e\x1fciproxy-done\x1e\n"

    def post_execute():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            try:
                nums = plt.get_fignums()
            except Exception:
                nums = []
            for num in nums:
                try:
                    buf = io.BytesIO()
                    plt.figure(num).savefig(buf, format="png", bbox_inches="tight")
                    sys.stdout.write(begin + base64.b64encode(buf.getvalue()).decode("ascii") + end)
                except Exception:
                    pass
            try:
                plt.close("all")
            except Exception:
                pass
        sys.stdout.write(done)
        sys.stdout.flush()

    get_ipython().events.register("post_execute", post_execute)
    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.show = lambda *args, **kwargs: None
    except Exception:
        pass


__ciproxy_prepare()
del __ciproxy_prepare
