"""bayesavg.runtime.numerics and bayesavg.training.ieee: the same bytes whatever the x86-64 CPU.

The decisive test runs the real training and evaluation code
(``tests/numerics_probe.py``) natively and on emulated CPUs, an Intel Haswell
(AVX2, no AVX-512) and an AMD EPYC, with ``qemu-x86_64``: every digest must be
the same. It is skipped only where ``qemu-x86_64`` is missing (Debian:
``apt-get install qemu-user``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesavg.runtime import numerics
from bayesavg.runtime.errors import UserError
from bayesavg.training import ieee

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "numerics_probe.py"
QEMU = shutil.which("qemu-x86_64")


def _env(**extra: str) -> dict[str, str]:
    """This environment without the pins, so each probe pins for itself."""
    drop = {*numerics.ISA_PINS, *numerics.THREAD_VARS, numerics.THREADS_ENV, numerics.MODE_ENV}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, **extra}


def _probe(prefix: list[str], prepared: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, str(PROBE), str(prepared)],
        env=_env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _digests(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_pin_sets_the_threads_and_the_instruction_set() -> None:
    env: dict[str, str] = {}
    assert numerics.pin(env) == env
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(numerics.DEFAULT_THREADS)
    if numerics.can_pin():
        assert {k: env[k] for k in numerics.ISA_PINS} == numerics.ISA_PINS


def test_native_mode_leaves_the_instruction_set_alone() -> None:
    env = {numerics.MODE_ENV: "native", numerics.THREADS_ENV: "3"}
    numerics.pin(env)
    assert env["OMP_NUM_THREADS"] == "3"
    assert not set(numerics.ISA_PINS) & set(env)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 1),  # one process: the default
        ({"WORLD_SIZE": "2"}, 1),  # a rank of 2: never under 1
        ({"BAYESAVG_THREADS": "4", "WORLD_SIZE": "1"}, 4),  # asked for: kept
        ({"WORLD_SIZE": "3"}, 1),
        ({"WORLD_SIZE": "2", "BAYESAVG_THREADS": "3"}, 3),  # asked for: kept
    ],
)
def test_ranks_share_the_default_threads_never_by_the_machine_s_cores(
    env: dict[str, str], expected: int
) -> None:
    assert numerics.threads(env) == expected
    pinned = dict(env)
    numerics.pin(pinned)
    assert pinned["OMP_NUM_THREADS"] == pinned["MKL_NUM_THREADS"] == str(expected)


def test_oversubscription_is_named_in_one_line() -> None:
    assert numerics.oversubscribed(2, {}, cores=2) is None  # 2 ranks x 1 thread
    assert numerics.oversubscribed(1, {}, cores=2) is None
    crowded = numerics.oversubscribed(2, {"BAYESAVG_THREADS": "2"}, cores=2)
    assert crowded == (
        "2 processes x 2 threads on 2 usable cores: oversubscribed, slower than fewer "
        "processes (BAYESAVG_NPROC) or threads (BAYESAVG_THREADS)"
    )
    assert numerics.oversubscribed(3, {}, cores=2) is not None  # 1 thread each is the least
    assert numerics.usable_cores() >= 1


def test_no_pins_where_the_avx2_path_does_not_exist() -> None:
    avx2 = frozenset({"sse2", "avx", "avx2", "fma"})
    assert numerics.can_pin("x86_64", avx2)
    assert not numerics.can_pin("x86_64", frozenset({"sse2", "avx"}))  # would fault
    assert not numerics.can_pin("aarch64", avx2)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("BAYESAVG_THREADS", "0", "BAYESAVG_THREADS: must be a positive integer (got '0')"),
        ("BAYESAVG_THREADS", "two", "BAYESAVG_THREADS: must be a positive integer (got 'two')"),
        # str.isdigit() takes a superscript two, which int() then refuses
        (
            "BAYESAVG_THREADS",
            "\u00b2",
            "BAYESAVG_THREADS: must be a positive integer (got '\u00b2')",
        ),
        ("BAYESAVG_NUMERICS", "fast", "BAYESAVG_NUMERICS: must be one of portable, native"),
    ],
)
def test_bad_settings_are_one_line(var: str, value: str, message: str) -> None:
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        numerics.pin({var: value})


_EVALUATE = ["--posterior", "x", "--predictor", "map", "--data", "mnist5k", "--out"]


def test_bad_setting_stops_the_command_with_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "bayesavg"),
            "evaluate",
            "--posterior",
            "x",
            "--predictor",
            "map",
            "--data",
            "mnist5k",
            "--out",
            str(tmp_path / "m.json"),
        ],
        env=_env(BAYESAVG_THREADS="0"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: BAYESAVG_THREADS: must be a positive integer (got '0')"
    ]


def test_a_change_after_torch_is_imported_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    numerics.pin()  # what conftest did: a repeat is fine
    monkeypatch.setenv(numerics.THREADS_ENV, str(numerics.threads() + 1))
    with pytest.raises(RuntimeError, match="after torch was imported would change"):
        numerics.pin()


def test_this_process_runs_as_pinned() -> None:
    assert torch.get_num_threads() == numerics.threads()
    if numerics.can_pin() and numerics.mode() == "portable":
        assert torch.backends.cpu.get_cpu_capability() == "AVX2"


def _floats(n: int) -> torch.Tensor:
    """Every exponent, random mantissas, and the edges: zero, subnormals, the largest."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 0x7F800000, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    edges = torch.tensor([0.0, 1.0, 2.0, 4.0, 1e-45, 1.17549435e-38, 3.4028235e38, 1e-30])
    return torch.cat([bits.view(torch.float32), edges])


def _doubles(n: int) -> torch.Tensor:
    """The same for float64: random bits below infinity, and the edges."""
    gen = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 0x7FF0000000000000, (n,), generator=gen, dtype=torch.int64)
    edges = torch.tensor([0.0, 1.0, 2.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308])
    return torch.cat([bits.view(torch.float64), edges.double()])


@pytest.mark.parametrize("values", [_floats, _doubles], ids=["float32", "float64"])
def test_ieee_sqrt_is_the_correctly_rounded_square_root(values) -> None:
    x = values(1_000_000)
    exact = torch.from_numpy(np.sqrt(x.numpy()))  # numpy: the hardware instruction
    assert torch.equal(ieee.sqrt(x), exact)
    assert ieee.sqrt(x).dtype == x.dtype
    strided = x[::3]
    assert torch.equal(ieee.sqrt(strided), exact[::3])
    assert torch.equal(ieee.sqrt(x[5]), exact[5])  # a 0-d tensor stays one


def test_ieee_sqrt_of_a_float64_that_needs_a_gradient_is_refused() -> None:
    with pytest.raises(ValueError, match="not differentiable"):
        ieee.sqrt(torch.ones(3, dtype=torch.float64, requires_grad=True))


def test_ieee_sqrt_of_other_dtypes_is_torchs() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        x = _floats(1000).clamp(max=60000).to(dtype)
        assert torch.equal(ieee.sqrt(x), x.sqrt())


@pytest.mark.slow  # two probes on one core and on two, as the emulated CPUs' (~28 s)
def test_the_thread_count_not_the_cores_decides(mnist5k_prepared) -> None:
    if not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two cores")
    out = mnist5k_prepared.out_dir
    one_core = _probe(["taskset", "-c", "0"], out)
    cores = _probe([], out)
    assert _digests(one_core) == _digests(cores)


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 missing (apt-get install qemu-user)")
@pytest.mark.parametrize(
    "cpu",
    [
        # Intel: AVX2, no AVX-512; ~5 minutes under emulation on 2 cores: make test-slow
        pytest.param("Haswell", marks=pytest.mark.slow),
        pytest.param("EPYC", marks=pytest.mark.slow),  # AMD (Zen 1): AVX2; ~35 s more
    ],
)
def test_an_emulated_cpu_computes_the_native_bytes(mnist5k_prepared, cpu: str) -> None:
    """The emulated run and the native one side by side: every digest equal."""
    out = mnist5k_prepared.out_dir
    emulated = _probe([str(QEMU), "-cpu", cpu], out)
    native = _digests(_probe([], out))
    assert native["settings"]["cpu_capability"] == "AVX2"  # type: ignore[index]
    assert _digests(emulated) == native


def test_without_the_pins_the_bytes_follow_the_cpu(mnist5k_prepared) -> None:
    """The control: on a CPU with AVX-512, torch's own choice changes the probe's bytes."""
    if not _has_avx512():  # asked first: the probe takes ~10 s to say the same
        pytest.skip("this CPU has no AVX-512: native and pinned are the same path")
    out = mnist5k_prepared.out_dir
    native = _digests(_probe([], out, BAYESAVG_NUMERICS="native"))
    if native["settings"]["cpu_capability"] == "AVX2":  # type: ignore[index]
        pytest.skip("torch dispatches this CPU to AVX2: native and pinned are the same path")
    assert _digests(_probe([], out))["pretrain"] != native["pretrain"]


def _square_roots(tree: ast.AST) -> list[int]:
    """Lines that take a tensor's square root other than through ieee, math or NumPy:
    ``x.sqrt()``, ``torch.sqrt(x)``, ``x.sqrt_()``, ``x.pow(0.5)``, ``x ** 0.5``."""
    exact = {"ieee", "math", "np", "numpy"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            named = isinstance(owner, ast.Name) and owner.id in exact
            if node.func.attr in ("sqrt", "sqrt_") and not named:
                lines.append(node.lineno)
            half = [a for a in node.args if isinstance(a, ast.Constant) and a.value == 0.5]
            if node.func.attr in ("pow", "pow_", "float_power") and half:
                lines.append(node.lineno)
        power = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)
        if power and isinstance(node.right, ast.Constant) and node.right.value == 0.5:
            lines += [] if isinstance(node.left, ast.Constant) else [node.lineno]
    return lines


def test_no_square_root_bypasses_ieee() -> None:
    """torch.sqrt's last bit follows the CPU: the code's square roots go through
    ieee.sqrt (or math/NumPy on plain numbers), ieee.py itself aside."""
    code = [*(ROOT / "src" / "bayesavg").rglob("*.py"), *(ROOT / "stages").glob("*.py")]
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(code)
        if path.name != "ieee.py"
        and (lines := _square_roots(ast.parse(path.read_text(), filename=str(path))))
    }
    assert not found, f"take these square roots with bayesavg.training.ieee.sqrt: {found}"


def test_the_square_root_reader_sees_each_form() -> None:
    code = "a = x.sqrt()\nb = torch.sqrt(x)\nc = x.pow(0.5)\nd = x ** 0.5\ne = ieee.sqrt(x)\n"
    code += "f = math.sqrt(2)\ng = np.sqrt(y)\nh = 2 ** 0.5\n"
    assert _square_roots(ast.parse(code)) == [1, 2, 3, 4]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "\u00b2", ""])
def test_a_bad_process_count_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from bayesavg.runtime import launch

    monkeypatch.setenv("BAYESAVG_NPROC", value)
    with pytest.raises(UserError, match=r"^BAYESAVG_NPROC: must be a positive integer \(got "):
        launch.nproc()


def _has_avx512() -> bool:
    """Whether the CPU says it has AVX-512 (its ``avx512f`` flag), the condition for
    torch's own dispatch to differ from the pinned AVX2 one."""
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return True  # no /proc: let the probe say
