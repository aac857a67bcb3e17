"""Record what a pipeline stage process imports and opens, for tests/test_pipeline.py.

Python imports ``sitecustomize`` at start-up from the first folder on its
path that has one; the end-to-end test puts this folder on PYTHONPATH and
sets BAYESAVG_TRACE_DIR, and every Python process of the run (DVC's own
too) then writes ``<pid>.json`` there at exit: its argv, working directory,
the files it opened for reading and the files of its imported modules
(also when it leaves through ``os._exit``, as stages do), and the calls
it made that a deterministic CUDA run refuses (``tests/cuda_determinism.py``:
its recorder is switched on as soon as the process imports torch). Without
BAYESAVG_TRACE_DIR this does nothing.
"""

import os

_TRACE_DIR = os.environ.get("BAYESAVG_TRACE_DIR")

if _TRACE_DIR:
    import atexit
    import json
    import re
    import sys

    _read: set[str] = set()
    _ATOMIC_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND

    def _audit(event: str, args: tuple) -> None:
        if event != "open":
            return
        path, mode, flags = args
        if not isinstance(path, str | bytes | os.PathLike):
            return  # an open file descriptor
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else False
        if not writes and not (isinstance(flags, int) and flags & _WRITE_FLAGS):
            name = os.path.abspath(os.fsdecode(path))
            # An atomic write's fsync reopens its own temp file and the folder it is
            # renamed into (runtime/io.py): writes, not reads of an input.
            if isinstance(flags, int) and flags & os.O_DIRECTORY:
                return
            if _ATOMIC_TEMP.fullmatch(os.path.basename(name)):
                return
            _read.add(name)

    def _dump() -> None:
        modules = {  # torch registers pseudo-modules whose __file__ is a bare name
            file
            for module in list(sys.modules.values())
            if isinstance(file := getattr(module, "__file__", None), str) and os.path.isabs(file)
        }
        record = {
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "read": sorted(_read),
            "modules": sorted(modules),
        }
        if _refused:  # the process imported torch
            record["cuda_refused"] = sorted(set(map(tuple, _refused[0].calls)))
        with open(os.path.join(_TRACE_DIR, f"{os.getpid()}.json"), "w") as f:
            json.dump(record, f)

    _refused: list = []

    class _AfterTorch:
        """A meta-path finder that lets torch import as usual, then switches the
        recorder on (it needs torch, which a stage imports after start-up)."""

        def find_spec(self, name, path, target=None):
            if name != "torch" or _refused:  # (a stage looks torch up before importing it)
                return None
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def run(module):
                    exec_module(module)
                    if not _refused:
                        _record_refused()

                spec.loader.exec_module = run
            return spec

    def _record_refused() -> None:
        import importlib.util

        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spec = importlib.util.spec_from_file_location(
            "_cuda_determinism", os.path.join(tests, "cuda_determinism.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        roots = (os.path.join(os.path.dirname(tests), "src"), os.path.join(os.getcwd(), "stages"))
        recorder = module.Recorder(roots)
        recorder.__enter__()  # for the rest of the process
        _refused.append(recorder)

    sys.meta_path.insert(0, _AfterTorch())
    sys.addaudithook(_audit)
    atexit.register(_dump)
    _exit = os._exit

    def _dump_then_exit(code: int) -> None:
        """Stages end with os._exit, which skips atexit: dump first."""
        _dump()
        _exit(code)

    os._exit = _dump_then_exit
