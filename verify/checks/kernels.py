"""kernel-parity: the installed fused_dit overlay's Triton kernels against their references, in the target."""
from __future__ import annotations

from ..registry import CheckResult, Outcome, check

KERNEL_PARITY_PROBE = "kernel_parity"


def interpreter_env(ctx) -> dict[str, str | None]:
    """TRITON_INTERPRET=1 when the kernels can only run in Triton's interpreter: --device cpu, or --device auto with
    a CPU build of torch. Otherwise it is removed (a value inherited from the user's shell would silently move a
    CUDA check onto the CPU) and the probe decides with torch.cuda.is_available(), turning the interpreter on
    itself, before importing triton, when no GPU answers."""
    device = ctx.options.device
    if device == "cpu" or (device == "auto" and not ctx.target.torch_cuda):
        return {"TRITON_INTERPRET": "1"}
    return {"TRITON_INTERPRET": None}


@check("kernel-parity", "the fused_dit overlay's kernels vs an fp32 reference and ComfyUI's eager chain "
       "(bf16 ulp gates on CUDA; small fp32 shapes under TRITON_INTERPRET=1 without one)", slow=True,
       opt_in="kernels")
def kernel_parity(ctx) -> CheckResult:
    name = "kernel-parity"
    target = ctx.target
    unusable = ctx.no_interpreter()
    if unusable:
        return CheckResult(name, Outcome.SKIP, unusable)
    if target.torch_version is None:
        return CheckResult(name, Outcome.SKIP, "torch is not installed in the target's environment")
    # The interpreter must be on before triton is imported, so it is decided here, in the probe's environment.
    env = interpreter_env(ctx)
    args = {**ctx.probe_args(None), "expect": {"installed": True}}
    result = ctx.run_probe(KERNEL_PARITY_PROBE, args, timeout=ctx.options.kernel_timeout,
                           env_extra=env).to_check(name)
    result.numbers = {"triton_interpret": env.get("TRITON_INTERPRET") == "1", **result.numbers}
    return result
