"""The layer as two PyTorch custom ops, so that ``torch.compile`` traces it without graph breaks.

``gmlp::grouped_mlp_forward`` returns y and, flattened (``gmlp.layer.state``), what the
backward needs; ``gmlp::grouped_mlp_backward`` turns dy and that state into the gradients. Each
op has a fake implementation that gives its outputs' shapes from its inputs', so
``torch.compile(..., fullgraph=True)`` sees two opaque calls whatever path runs inside and
however the routing changes. A ``torch.autograd.Function`` (``setup_context``,
``save_for_backward``) connects them: traced, or under a ``torch.func`` transform, it calls the
ops; in eager mode it calls their implementations directly, which skips the custom-op
dispatcher's host time. The common eager call (real tensors, no kept weights) takes a shorter
way still, ``_EagerGroupedMLP``: its state is saved as it is rather than returned as outputs,
and its backward reuses the forward's plan. The forward op also has its own ``register_autograd``, for callers of
``torch.ops.gmlp.grouped_mlp_forward``. Inside the ops everything is eager: the plan (cached,
``gmlp.dispatch.plan_cache``), split-size validation, the kernels and, when it is on, the cross-check
(read where each op runs). The layout of the flattened state is a function of the config, the
composition and whether there are probs: the forward records it under that key (``_SPECS``)
and the backward reads it there.

Split sizes are validated without a host sync on a GPU: ``torch._assert_async`` stops the
stream with a device-side assert when they are negative or do not sum to T (PyTorch's way with
data-dependent errors; the CUDA context is lost, as with any device assert), and
``GMLP_VALIDATE=1`` adds a synchronous check that raises ``ValueError`` with the sizes. On the
CPU the check is free and always raises ``ValueError``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._functorch.utils import unwrap_dead_wrappers

from gmlp.contract.gate_up import GateUp, GateUpLayout, gate_up_views
from gmlp.cutedsl.sm100.layer import sm100_backward, sm100_forward
from gmlp.debug import active_settings as active_cross_check
from gmlp.debug.crosscheck import CrossCheck, CrossCheckSettings
from gmlp.dispatch.plan_cache import LayerConfig, cached_plan, decode_config
from gmlp.layer.blockwise_steps import blockwise_backward, blockwise_forward, fake_blockwise_saved
from gmlp.layer.state import Spec, flatten, unflatten
from gmlp.layer.steps import OpRunner, fake_layer_saved, grouped_mlp_backward, grouped_mlp_forward
from gmlp.mxfp8.buffers import empty_quantize
from gmlp.mxfp8.problem import check_split_values
from gmlp.mxfp8.routing import DeviceGroups, device_groups, should_check_split_values, sizes_valid
from gmlp.system.env import setting

__all__ = ["grouped_mlp", "kept_weights", "validate_split_sizes", "allocating_quantize"]

_SPECS: dict[tuple, Spec] = {}  # structure key -> spec of the forward's flattened state (a few per module)


def _remember_spec(key: tuple, spec: Spec) -> None:
    _SPECS[key] = spec


def _spec(key: tuple) -> Spec:
    spec = _SPECS.get(key)
    if spec is None:
        raise RuntimeError(f"gmlp: no forward state layout for {key}: the backward of a gmlp.GroupedMLP call runs in "
                           "the process of its forward, after it")
    return spec


def _structure_key(config: str, sm100: bool, probs: Tensor | None) -> tuple:
    """What the layout of the forward's state depends on: the config, the composition, whether
    there are probs (not the sizes: the state holds tensors and size-free constants only)."""
    return config, sm100, probs is not None


def _as_dtype(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """``tensor.to(dtype)``, skipped where it has that dtype (the call costs host time even then)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def validate_split_sizes(split_sizes: Tensor, tokens: int, groups: DeviceGroups | None = None) -> None:
    """No bad split sizes may give a result: on the CPU, or with ``GMLP_VALIDATE=1``, a
    ``ValueError`` naming them (a host read); on a GPU otherwise a device-side assert
    (``torch._assert_async``: no sync, safe in CUDA graphs), on the validity flag of ``groups``
    (their device prefix sums) where the caller has them."""
    if should_check_split_values(split_sizes):
        if _capturing():
            raise RuntimeError("GMLP_VALIDATE=1 reads split_sizes on the host, which a CUDA graph capture cannot do; "
                               "unset it while capturing (the device-side check stays on)")
        check_split_values(split_sizes, tokens)
        return
    valid = groups.valid if groups is not None else sizes_valid(split_sizes, tokens)  # the groups': no launch
    torch._assert_async(valid, "gmlp: split_sizes are negative or do not sum to x.shape[0] "
                               "(GMLP_VALIDATE=1 raises a ValueError with the sizes instead)")


def _runner(config: LayerConfig, plan, split_sizes: Tensor, reused: dict | None,
            settings: CrossCheckSettings | None) -> OpRunner:
    if settings is not None and _capturing():
        raise RuntimeError("the cross-check compares two paths on the host, which a CUDA graph capture cannot do "
                           "(torch.compile mode='reduce-overhead' captures one): turn it off while capturing, or "
                           "compile without CUDA graphs")
    check = CrossCheck(plan, settings, split_sizes) if settings is not None else None
    return OpRunner(plan, check, reused_weights=reused, keep_weights=config.weight_cache == "update")


def _plan(config: LayerConfig, x: Tensor, split_sizes: Tensor, w1: Tensor, w2: Tensor):
    del split_sizes  # as many as experts (GroupedMLP checks it); the sizes come from the weights
    return cached_plan(config, x.shape[0], w1.shape[0], w2.shape[1], w2.shape[2], w1.dtype, x.dtype, x.device)


_KEPT_KEY = "kept weights"
_INPUTS = 8  # x, split_sizes, probs, w1, w3, b1, w2, b2 (then the reused weights)


def _w1_operand(layer: LayerConfig, w1: Tensor, w3: Tensor | None) -> Tensor | GateUp:
    """W1 as the layer reads it: the (E, 2F | F, H) tensor, or the gate and up views of the
    config's layout (``gmlp.contract.gate_up``; w3 holds the up weights of the SEPARATE layout)."""
    if layer.gate_up is GateUpLayout.HALVES:
        if w3 is not None:
            raise ValueError("w3 (the up weights) is given with GateUpLayout.SEPARATE only, and the layer's layout is "
                             "HALVES")
        return w1
    if not layer.activation.gated:
        raise ValueError(f"W1's gate/up layout {layer.gate_up.name} needs a gated activation, got {layer.activation.name}")
    return gate_up_views(layer.gate_up, w1, w3)


def _step_groups(split_sizes: Tensor, tokens: int) -> DeviceGroups:
    """The step's expert groups, computed once for every op: one Triton launch where Triton runs
    (``gmlp.triton_ref.expert_groups``, imported here: ``import gmlp`` does not import Triton),
    else the torch ops of ``device_groups``."""
    if not (split_sizes.is_cuda or setting("TRITON_INTERPRET")):
        return device_groups(split_sizes, tokens)
    from gmlp.triton_ref.expert_groups import expert_groups

    return expert_groups(split_sizes, tokens)


def _forward_impl(x: Tensor, split_sizes: Tensor, probs: Tensor | None, w1: Tensor, w3: Tensor | None,
                  b1: Tensor | None, w2: Tensor, b2: Tensor | None, reused: list[Tensor], config: str) -> list[Tensor]:
    """[y, *the forward's state] (``gmlp.layer.steps`` or the SM100 composition, as planned)."""
    layer = decode_config(config)
    plan = _plan(layer, x, split_sizes, w1, w2)
    y, saved, kept = _forward_steps(layer, plan, x, split_sizes, probs, w1, w3, b1, w2, b2, reused,
                                    active_cross_check())
    state, spec = flatten((saved, kept), [x, split_sizes, probs, w1, w3, b1, w2, b2, *reused])
    _remember_spec(_structure_key(config, plan.sm100, probs), spec)
    return [_as_dtype(y, x.dtype), *state]


def _forward_steps(layer: LayerConfig, plan, x: Tensor, split_sizes: Tensor, probs: Tensor | None, w1: Tensor,
                   w3: Tensor | None, b1: Tensor | None, w2: Tensor, b2: Tensor | None, reused: list[Tensor],
                   settings: CrossCheckSettings | None) -> tuple:
    """(y, what the backward needs, the quantized weights kept for later forwards or None): the
    split check, then ``gmlp.layer.steps`` or the SM100 composition, as ``plan`` says;
    ``settings``: the cross-check's, or None."""
    # the step sequence reads the prefix sums at every op; the SM100 composition groups padded rows itself
    groups = None if plan.sm100 else _step_groups(split_sizes, x.shape[0])
    validate_split_sizes(split_sizes, x.shape[0], groups)
    if groups is not None:  # bad sizes have raised, or the stream stops at their assert before any kernel
        groups = DeviceGroups(groups.row_start, groups.tile_start, groups.block_start, groups.valid, checked=True)
    reused_weights = unflatten(_spec((_KEPT_KEY, plan.sm100, layer.recipe)), reused, []) if reused else None
    run = _runner(layer, plan, split_sizes, reused_weights, settings)
    args = (run, x, split_sizes, probs, _w1_operand(layer, w1, w3), b1, w2, b2, layer.activation, layer.recipe)
    if plan.sm100:
        y, saved = sm100_forward(*args)
    else:
        y, saved = (blockwise_forward if plan.blockwise else grouped_mlp_forward)(*args, groups=groups)
    return y, saved, run.kept_weights


@torch.library.custom_op("gmlp::grouped_mlp_forward", mutates_args=())
def _forward(x: Tensor, split_sizes: Tensor, probs: Tensor | None, w1: Tensor, w3: Tensor | None, b1: Tensor | None,
             w2: Tensor, b2: Tensor | None, reused: list[Tensor], config: str) -> list[Tensor]:
    """``_forward_impl`` as an op that torch.compile sees as one opaque call."""
    return _forward_impl(x, split_sizes, probs, w1, w3, b1, w2, b2, reused, config)


@_forward.register_fake
def _forward_fake(x, split_sizes, probs, w1, w3, b1, w2, b2, reused, config):
    layer = decode_config(config)
    if layer.weight_cache is not None:
        raise NotImplementedError("weight_cache under torch.compile: the kept quantized weights live on the module, "
                                  "outside the graph; call the layer eagerly for weight_cache='update'/'reuse'")
    # which composition runs does not depend on the token count, which may be symbolic here; the
    # weights' sizes (symbolic for a functional caller's weights) are specialized by int()
    experts, hidden, ffn = (int(size) for size in (w1.shape[0], w2.shape[1], w2.shape[2]))
    plan = cached_plan(layer, 1, experts, hidden, ffn, w1.dtype, x.dtype, x.device)
    if plan.sm100:  # the composition itself, its quantizes and kernels only allocating their outputs
        y, saved = sm100_forward(allocating_quantize, x, split_sizes, probs, w1, b1, w2, b2, layer.activation,
                                 layer.recipe, launch=_no_launch)
    elif plan.blockwise:
        saved = fake_blockwise_saved(x, split_sizes, probs, _w1_operand(layer, w1, w3), b1, w2, b2, layer.recipe)
    else:
        saved = fake_layer_saved(x, split_sizes, probs, _w1_operand(layer, w1, w3), b1, w2, b2, layer.activation,
                                 layer.recipe)
    state, spec = flatten((saved, None), [x, split_sizes, probs, w1, w3, b1, w2, b2], traced=True)
    _remember_spec(_structure_key(config, plan.sm100, probs), spec)
    return [x.new_empty(x.shape), *state]


def allocating_quantize(site: str, x: Tensor, **quantize_args):
    """A layer runner (site, x, quantize arguments) whose quantizes only allocate their outputs:
    the SM100 composition's runner when traced (and on meta tensors in the compile tests)."""
    del site
    return empty_quantize(x, **quantize_args)


def _no_launch(site: str, call) -> None:
    """The SM100 composition's launcher when traced: the kernels' outputs are allocated by their calls."""
    del site, call


def _gradients(dy: Tensor, inputs: list[Tensor | None], state: list[Tensor], config: str,
               main_grads: tuple[Tensor | None, ...] | None, settings: CrossCheckSettings | None) -> list[Tensor]:
    """The gradients, from dy, the forward's inputs and its state: [dx, dprobs if probs, then
    dw1, dw3, db1, dw2, db2 for the parameters there are], or, given ``main_grads`` (the fp32
    ``main_grad`` of w1, w3, b1, w2, b2; None for a missing one), [dx, dprobs if probs] with the
    parameters' gradients added into those. ``settings``: the cross-check's, or None."""
    layer = decode_config(config)
    x, split_sizes, probs, w1, w3, b1, w2, b2 = inputs[:_INPUTS]
    plan = _plan(layer, x, split_sizes, w1, w2)
    saved, _ = unflatten(_spec(_structure_key(config, plan.sm100, probs)), state, inputs)
    return _backward_steps(dy, inputs, saved, layer, plan, main_grads, settings)


def _backward_steps(dy: Tensor, inputs: list[Tensor | None], saved, layer: LayerConfig, plan,
                    main_grads: tuple[Tensor | None, ...] | None, settings: CrossCheckSettings | None) -> list[Tensor]:
    """``_gradients`` from the forward's saved tree and its plan."""
    x, split_sizes, probs, w1, w3, b1, w2, b2 = inputs[:_INPUTS]
    run = _runner(layer, plan, split_sizes, None, settings)
    weight_dtype = torch.float32 if main_grads is not None else w1.dtype
    into = None  # what the backward adds into: W1's and W2's main_grad
    if main_grads is not None:
        # gate and up as two tensors: a pair; interleaved (rows 2H apart): none, the sums are added below
        w1_into = {GateUpLayout.HALVES: main_grads[0], GateUpLayout.SEPARATE: (main_grads[0], main_grads[1]),
                   GateUpLayout.INTERLEAVED: None}[layer.gate_up]
        into = (w1_into, main_grads[3])
    backward = sm100_backward if plan.sm100 else blockwise_backward if plan.blockwise else grouped_mlp_backward
    grads = backward(run, dy.contiguous(), saved, layer.activation, layer.recipe, weight_dtype, into)
    out = [_as_dtype(grads.dx, x.dtype)]
    if probs is not None:
        out.append(_as_dtype(grads.dprobs, probs.dtype))
    dw1, dw3 = _w1_grads(layer.gate_up, grads.dw1)
    params = ((w1, dw1), (w3, dw3), (b1, grads.db1), (w2, grads.dw2), (b2, grads.db2))
    if main_grads is None:
        return out + [_as_dtype(grad, param.dtype) for param, grad in params if param is not None]
    for main_grad, (param, grad) in zip(main_grads, params):
        if param is not None and grad is not main_grad:  # not already added by the backward itself
            main_grad.add_(grad)  # fp32 accumulation
    return out


def _w1_grads(layout: GateUpLayout, dw1: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None]:
    """The gradients of w1 and w3 from the backward's dW1 (its gate and up apart unless HALVES):
    the interleaved layout's one (E, F, 2, H) gradient is their stack, a copy."""
    if layout is GateUpLayout.HALVES:
        return dw1, None
    if layout is GateUpLayout.SEPARATE:
        return dw1
    return torch.stack(dw1, dim=2), None


@torch.library.custom_op("gmlp::grouped_mlp_backward", mutates_args=())
def _backward(dy: Tensor, inputs: list[Tensor | None], state: list[Tensor], config: str) -> list[Tensor]:
    """``_gradients`` with every gradient returned (no main_grad: GroupedMLP adds into main
    grads in eager mode only, through ``_gradients`` itself)."""
    return _gradients(dy, inputs, state, config, None, active_cross_check())


@_backward.register_fake
def _backward_fake(dy, inputs, state, config):
    return [torch.empty_like(t) for t in inputs[:_INPUTS] if t is not None and t.dtype.is_floating_point]


def _setup_context(ctx, inputs, output) -> None:
    """What the backward needs: the inputs and the forward's state (``save_for_backward``)."""
    x, split_sizes, probs, w1, w3, b1, w2, b2, reused, config = inputs
    ctx.config = config
    ctx.num_inputs = _INPUTS + len(reused)
    ctx.save_for_backward(x, split_sizes, probs, w1, w3, b1, w2, b2, *reused, *output[1:])
    # only y has a gradient: no zeros are made for the state's outputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    # (decode_config is not traced: under torch.compile there are none)
    ctx.main_grads = None if torch.compiler.is_compiling() else _main_grads(decode_config(config), (w1, w3, b1, w2, b2))
    # the forward's cross-check settings apply to its backward (which may run in another thread)
    ctx.cross_check = None if torch.compiler.is_compiling() else active_cross_check()


def _main_grads(layer: LayerConfig, params: tuple[Tensor | None, ...]) -> tuple[Tensor | None, ...] | None:
    """The ``main_grad`` of each of (w1, w3, b1, w2, b2) that the backward adds into (None for a
    missing parameter), or None without ``accumulate_main_grad``. Eager only (GroupedMLP refuses
    it under torch.compile)."""
    if not layer.accumulate_main_grad:
        return None
    return tuple(None if p is None else p.main_grad for p in params)


def _input_grads(ctx, dy: Tensor | None, traced: bool) -> tuple:
    """(dx, dprobs, dw1, dw3, db1, dw2, db2) for autograd (None where there is none); ``traced``:
    call the backward op (a tracer's tensors have no data for the kernels)."""
    saved = ctx.saved_tensors
    inputs, state = list(saved[:ctx.num_inputs]), list(saved[ctx.num_inputs:])
    x, split_sizes, probs, w1, w3, b1, w2, b2 = inputs[:_INPUTS]
    main_grads = ctx.main_grads
    if dy is None:  # an undefined gradient of y (not materialized; gradcheck sends one)
        dy = torch.zeros_like(x)
    if main_grads is not None:
        computed = iter(_gradients(dy, inputs, state, ctx.config, main_grads, ctx.cross_check))
    elif traced or dy.is_meta or torch._C._functorch.is_functorch_wrapped_tensor(dy):
        # traced, on meta tensors, or under a torch.func transform (whose wrapped tensors the
        # kernels cannot read; the op is called on the tensors underneath)
        computed = iter(_backward(dy, inputs, state, ctx.config))
    else:
        computed = iter(_gradients(dy, inputs, state, ctx.config, None, ctx.cross_check))
    return _autograd_grads(computed, inputs, main_grads)


def _autograd_grads(computed, inputs: list[Tensor | None], main_grads: tuple | None) -> tuple:
    """(dx, dprobs, dw1, dw3, db1, dw2, db2) for autograd, from the backward's gradients in
    ``_gradients``' order (None where an input is missing)."""
    computed = iter(computed)
    x, split_sizes, probs, w1, w3, b1, w2, b2 = inputs[:_INPUTS]
    dx = next(computed)
    dprobs = next(computed) if probs is not None else None
    # autograd gets no gradient for parameters whose main_grad the backward added into
    weight_grads = [next(computed) if p is not None and main_grads is None else None for p in (w1, w3, b1, w2, b2)]
    return dx, dprobs, *weight_grads


class _GroupedMLPFunction(torch.autograd.Function):
    """Autograd of the layer: forward and backward call the ops when traced by torch.compile
    (or under a torch.func transform), and their implementations directly in eager mode (the
    same functions, without the custom-op dispatcher's host time: about 0.2 ms per call)."""

    @staticmethod
    def forward(x, split_sizes, probs, w1, w3, b1, w2, b2, reused, config):
        # meta tensors (tracing, deferred init): the op, whose fake implementation gives the shapes
        run = _forward if torch.compiler.is_compiling() or x.is_meta else _forward_impl
        return tuple(run(x, split_sizes, probs, w1, w3, b1, w2, b2, reused, config))

    setup_context = staticmethod(_setup_context)

    @staticmethod
    def backward(ctx, *grads):
        dx, dprobs, dw1, dw3, db1, dw2, db2 = _input_grads(ctx, grads[0], torch.compiler.is_compiling())
        return dx, None, dprobs, dw1, dw3, db1, dw2, db2, None, None

    @staticmethod
    def vmap(info, in_dims, *args):
        raise NotImplementedError("gmlp.GroupedMLP has no batching rule for torch.func.vmap: its rows are already a "
                                  "batch (tokens grouped by expert); concatenate the tokens instead")


class _EagerGroupedMLP(torch.autograd.Function):
    """The layer's autograd in eager mode, the common case (no tracer, no torch.func transform,
    no kept weights): the forward's state is saved as it is (``save_for_backward`` of its
    tensors, the tree's layout on ctx) instead of returned as outputs, as the custom op must
    (which needs every aliasing between them resolved), and the backward runs the forward's plan
    (one plan lookup per step). ``_GroupedMLPFunction`` serves the other cases."""

    @staticmethod
    def forward(ctx, x, split_sizes, probs, w1, w3, b1, w2, b2, config):
        layer = decode_config(config)
        plan = _plan(layer, x, split_sizes, w1, w2)
        settings = active_cross_check()
        y, saved, _ = _forward_steps(layer, plan, x, split_sizes, probs, w1, w3, b1, w2, b2, [], settings)
        inputs = [x, split_sizes, probs, w1, w3, b1, w2, b2]
        state, spec = flatten(saved, inputs, traced=True)  # the inputs found by identity, the rest saved as is
        ctx.save_for_backward(*inputs, *state)
        ctx.layer, ctx.plan, ctx.spec = layer, plan, spec
        ctx.set_materialize_grads(False)
        ctx.main_grads = _main_grads(layer, (w1, w3, b1, w2, b2))
        ctx.cross_check = settings  # the forward's settings, for a backward in autograd's thread
        return _as_dtype(y, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        saved_tensors = ctx.saved_tensors
        # autograd lets go of the saved tensors now unless the graph is retained (retain_graph: a
        # later backward reads them again), so that the backward frees each after its last reader
        ctx.maybe_clear_saved_tensors()
        inputs, state = list(saved_tensors[:_INPUTS]), list(saved_tensors[_INPUTS:])
        del saved_tensors
        if dy is None:  # an undefined gradient of y (not materialized)
            dy = torch.zeros_like(inputs[0])
        saved = unflatten(ctx.spec, state, inputs)
        del state  # the state's tensors now live in saved only
        computed = _backward_steps(dy, inputs, saved, ctx.layer, ctx.plan, ctx.main_grads, ctx.cross_check)
        dx, dprobs, dw1, dw3, db1, dw2, db2 = _autograd_grads(computed, inputs, ctx.main_grads)
        return dx, None, dprobs, dw1, dw3, db1, dw2, db2, None


def _op_backward(ctx, grads):
    """The forward op's own autograd (for callers of torch.ops.gmlp.grouped_mlp_forward)."""
    dx, dprobs, dw1, dw3, db1, dw2, db2 = _input_grads(ctx, grads[0], traced=True)
    return dx, None, dprobs, dw1, dw3, db1, dw2, db2, [None] * (ctx.num_inputs - _INPUTS), None


torch.library.register_autograd("gmlp::grouped_mlp_forward", _op_backward, setup_context=_setup_context)


def grouped_mlp(x: Tensor, split_sizes: Tensor, probs: Tensor | None, w1: Tensor, b1: Tensor | None, w2: Tensor,
                b2: Tensor | None, config: LayerConfig | str, reused: list[Tensor] | None = None,
                w3: Tensor | None = None) -> list[Tensor]:
    """[y, *state] of the forward op (``GroupedMLP.forward`` checks the arguments first); [y] in
    eager mode without kept weights, where autograd keeps the state. W1 is stored as the config's
    ``gate_up`` layout says (``gmlp.contract.gate_up``; ``w3``: the up weights of the SEPARATE
    layout, w1 then the gate's)."""
    text = config if isinstance(config, str) else config.encode()
    return list(_apply(x, split_sizes, probs, w1, w3, b1, w2, b2, reused or [], text))


def _apply(*args) -> tuple:
    """The layer's autograd call: ``_GroupedMLPFunction.apply(*args)`` traced or under a torch.func
    transform; in eager mode ``_EagerGroupedMLP`` (no weight cache, real tensors), else
    ``_GroupedMLPFunction``. In eager mode each is called as ``Function.apply`` calls it without
    transforms, minus its Python: for ``_GroupedMLPFunction`` the binding of the arguments to
    ``forward``'s signature (``inspect.signature`` on every call, about 30 us of host time, binding
    nothing here: no defaults, no keywords), for both its checks (about 6 us)."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return _GroupedMLPFunction.apply(*args)
    x, reused, config = args[0], args[8], args[9]
    if not (x.is_meta or reused or decode_config(config).weight_cache is not None):
        eager_args = unwrap_dead_wrappers((*args[:8], config))
        return (super(torch.autograd.Function, _EagerGroupedMLP).apply(*eager_args),)
    return super(torch.autograd.Function, _GroupedMLPFunction).apply(*unwrap_dead_wrappers(args))


def kept_weights(outputs: list[Tensor], config: str, x: Tensor, split_sizes: Tensor, probs: Tensor | None,
                 w1: Tensor, b1: Tensor | None, w2: Tensor, b2: Tensor | None,
                 w3: Tensor | None = None) -> tuple[list[Tensor], dict]:
    """The quantized weights a forward with ``weight_cache="update"`` kept, from its outputs:
    (their tensors, to pass as ``reused`` to later forwards, and the site -> quantized dict)."""
    layer = decode_config(config)
    plan = _plan(layer, x, split_sizes, w1, w2)
    key = _structure_key(config, plan.sm100, probs)
    _, kept = unflatten(_spec(key), outputs[1:], [x, split_sizes, probs, w1, w3, b1, w2, b2])
    tensors, spec = flatten(kept, [])
    _remember_spec((_KEPT_KEY, plan.sm100, layer.recipe), spec)
    return tensors, kept
