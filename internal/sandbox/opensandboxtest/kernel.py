# Run once as a hidden cell in each new kernel of the double (server.go): what the code-interpreter
# image's IPython kernel offers that the exec sandbox's kernel lacks, as far as clients use it.
# get_ipython().events.register("post_execute", f) runs f at the end of every user cell, before
# the kernel's own end-of-cell figure flush, as IPython runs user callbacks registered before the
# inline backend's. Hidden cells (builtins._osb_hidden set) run no callback.
def __osb_kernel():
    import builtins, sys

    kernel = sys._getframe(2).f_globals  # the exec sandbox kernel's module: its _execute runs cells
    flush = kernel.get("_flush_figures")
    callbacks = {"post_execute": [], "pre_execute": [], "pre_run_cell": [], "post_run_cell": []}

    class Events:
        def register(self, name, fn):
            if name not in callbacks:
                raise KeyError("Unknown event type: %s" % name)
            callbacks[name].append(fn)

        def unregister(self, name, fn):
            callbacks[name].remove(fn)

    class Shell:
        events = Events()

    shell = Shell()
    builtins.get_ipython = lambda: shell

    def end_of_cell():
        if getattr(builtins, "_osb_hidden", False):
            builtins._osb_hidden = False
        else:
            for fn in list(callbacks["post_execute"]):
                try:
                    fn()
                except Exception as exc:
                    print("Error in callback %r (for post_execute): %r" % (fn, exc), file=sys.stderr)
        if flush is not None:
            flush()

    if flush is not None and "_execute" in kernel:
        kernel["_flush_figures"] = end_of_cell


__osb_kernel()
del __osb_kernel
