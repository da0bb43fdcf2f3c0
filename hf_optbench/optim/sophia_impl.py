"""Sophia-G (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
Pre-training", arXiv:2305.14342; github.com/Liuhong99/Sophia) for a stock ``transformers.Trainer``.

Sophia-G's update is  p <- p(1 - lr*wd);  m <- b1*m + (1-b1)*g;  p <- p - lr * clip(m / (rho * B * h), 1)
where h is an EMA (b2) of the Gauss-Newton-Bartlett (GNB) estimate g_hat (.) g_hat, refreshed every k steps from
one extra forward/backward with labels *sampled from the model's own distribution*; B is the number of tokens per
optimizer step (the repository's ``bs = total_bs * block_size``).

What is used from a library and what is written here:
* the update (momentum, decoupled decay, clipped preconditioned step) is ``pytorch_optimizer.SophiaH``'s, run
  with ``p=1`` (clip at 1) so that it equals Sophia-G's when its Hessian EMA holds rho * B * h;
* pytorch-optimizer (4.1) has no Sophia-G: SophiaH estimates the Hessian itself with Hutchinson probes, which need
  ``loss.backward(create_graph=True)`` that Trainer never does. The GNB estimate (:func:`gnb_hessian_update`) and
  the :class:`SophiaGHessianCallback` that runs it every k steps inside Trainer are therefore written here.

Without the callback, SophiaG would silently degrade to sign-momentum; it raises instead (see
:meth:`SophiaG.step`). ``hf_optbench.optim.registry.optimizer_callbacks(optimizer)`` returns the callback for a Trainer.

The registry entry (cited defaults, builder, memory-planner layout) is ``hf_optbench/optim/sophia.py``, which
re-exports this module's public names.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch
from pytorch_optimizer import SophiaH
from transformers import TrainerCallback

from hf_optbench.optim.unwrap import innermost_optimizer

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments

# SophiaH re-estimates the Hessian itself whenever (step - 1) % update_period == 0; we drive the cadence from
# outside, so its own period is set beyond any run's length (step 1 is handled in SophiaG.step).
_NEVER = sys.maxsize // 2


class SophiaG(SophiaH):
    """Sophia-G: ``pytorch_optimizer.SophiaH``'s clipped update fed with GNB Hessian estimates.

    Defaults are the Sophia repository's (sophia.py: betas (0.965, 0.99), rho 0.04, weight_decay 0.1, eps 1e-15;
    interval k = 10 in train_sophiag.py). ``update_period`` is k: the callback estimates after every k-th step.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.965, 0.99),
        rho: float = 0.04,
        weight_decay: float = 0.1,
        update_period: int = 10,
        eps: float = 1e-15,
        maximize: bool = False,
        foreach: bool | None = None,
    ) -> None:
        if rho <= 0:
            raise ValueError(f"rho must be positive, got {rho}")
        if update_period < 1:
            raise ValueError(f"update_period must be >= 1, got {update_period}")
        super().__init__(
            params, lr=lr, betas=betas, weight_decay=weight_decay, weight_decouple=True, fixed_decay=False,
            p=1.0, update_period=_NEVER, num_samples=1, eps=eps, maximize=maximize, foreach=foreach,
        )
        for group in self.param_groups:
            group.setdefault("rho", rho)
        self.gnb_update_period = update_period
        # kept in the state dict (param group 0) so that a resumed run keeps its count
        self.param_groups[0].setdefault("gnb_updates", 0)

    def __str__(self) -> str:
        return "SophiaG"

    @torch.no_grad()
    def update_hessian(self, tokens_per_step: int) -> None:
        """Fold the GNB estimate held in ``p.grad`` (gradients of the sampled-label loss) into the Hessian EMA:
        h <- b2*h + (1-b2) * rho * B * g (.) g. Call between a sampled-label backward and ``zero_grad``."""
        if tokens_per_step <= 0:
            raise ValueError(f"tokens_per_step must be positive, got {tokens_per_step}")
        for group in self.param_groups:
            self.init_group(group)  # creates 'momentum'/'hessian_moment' for params with a gradient
            _, beta2 = group["betas"]
            scale = (1.0 - beta2) * group["rho"] * tokens_per_step
            for p in group["params"]:
                if p.grad is None:
                    continue
                # 'hessian_moment' is SophiaH's EMA of the Hessian diagonal; Sophia-G updates it in place here
                # (the repository's update_hessian), so the EMA survives checkpoints and costs no extra buffer.
                h = self.state[p]["hessian_moment"]
                h.mul_(beta2).addcmul_(p.grad, p.grad, value=scale)
        self.param_groups[0]["gnb_updates"] = self.param_groups[0].get("gnb_updates", 0) + 1

    @torch.no_grad()
    def step(self, closure: Any = None, hessian: list[torch.Tensor] | None = None) -> Any:  # type: ignore[override]
        steps_done = self.param_groups[0].get("step", 0)
        if self.param_groups[0].get("gnb_updates", 0) == 0 and steps_done >= self.gnb_update_period:
            raise RuntimeError(
                f"SophiaG has taken {steps_done} steps without a Hessian estimate: add "
                "hf_optbench.optim.sophia_impl.SophiaGHessianCallback (hf_optbench.optim.registry.optimizer_callbacks) to the "
                "Trainer's callbacks, or call update_hessian() every update_period steps."
            )
        if hessian is None and steps_done == 0:
            # SophiaH would run its Hutchinson estimate on step 1 (which needs create_graph=True). Hand it each
            # param's own EMA instead: lerp(h, h) leaves h unchanged, as in the repository (h starts at zero).
            for group in self.param_groups:
                self.init_group(group)
            hessian = [
                self.state[p]["hessian_moment"] if "hessian_moment" in self.state[p]
                else torch.zeros((), dtype=p.dtype, device=p.device).expand(p.shape)  # no grad: skipped anyway
                for group in self.param_groups
                for p in group["params"]
            ]
        loss = super().step(closure, hessian=hessian)
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    # SophiaH keeps the last estimate under 'hessian'; here it aliases the EMA (or a broadcast
                    # zero): drop it so it neither costs memory in a checkpoint nor doubles on reload.
                    self.state[p].pop("hessian", None)
        return loss


def gnb_hessian_update(
    model: torch.nn.Module,
    optimizer: SophiaG,
    input_ids: torch.Tensor,
    *,
    tokens_per_step: int,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> float:
    """One Gauss-Newton-Bartlett estimate (Sophia paper, Alg. 2): forward ``input_ids``, sample labels from the
    model's softmax, backward the cross-entropy against them, fold g (.) g into ``optimizer``'s Hessian EMA, and
    clear the gradients. Returns the sampled-label loss.

    Labels are sampled with ``generator`` (not the global RNG) so that Sophia runs draw the same data order as the
    other optimizers. Under DDP the gradients are averaged over ranks first (the repository backprops through the
    DDP model, which does the same).
    """
    was_training = model.training
    device_type = input_ids.device.type
    ctx = (torch.autocast(device_type=device_type, dtype=autocast_dtype) if autocast_dtype is not None
           else torch.autocast(device_type=device_type, enabled=False))
    model.zero_grad(set_to_none=True)
    with torch.enable_grad(), ctx:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        flat = logits.reshape(-1, logits.size(-1)).float()
        with torch.no_grad():
            sampled = torch.multinomial(torch.softmax(flat, dim=-1), 1, generator=generator).squeeze(-1)
            if attention_mask is not None:
                sampled = sampled.masked_fill(attention_mask.reshape(-1) == 0, -100)
        loss = torch.nn.functional.cross_entropy(flat, sampled, ignore_index=-100)
    loss.backward()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        for p in model.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad.div_(world)
    optimizer.update_hessian(tokens_per_step)
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return float(loss.detach())


class SophiaGHessianCallback(TrainerCallback):
    """Runs :func:`gnb_hessian_update` after every k-th optimizer step of a ``transformers.Trainer``.

    It runs in ``on_optimizer_step`` (right after ``optimizer.step()``, inside the step), not ``on_step_end``: the
    estimate is part of Sophia-G's cost per step, and hf_optbench's timing probe measures a step from
    ``on_step_begin`` to its own ``on_step_end``, which runs before later callbacks' ``on_step_end`` (there the
    estimate fell outside the timed window and Sophia's tokens/s and MFU were overstated). The order matches the
    Sophia repository's loop (optimizer step, then the estimate on the same batch); Trainer's own ``zero_grad``
    afterwards is then a no-op.

    The batch is the last training micro-batch the model saw (captured by a forward pre-hook, a reference, not a
    copy), as in the Sophia repository's loop. B (tokens per optimizer step) is micro-batch x accumulation x world
    size x sequence length. Example::

        trainer = Trainer(model=model, args=args, optimizers=(opt, sched), callbacks=[SophiaGHessianCallback()])
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._inputs: dict[str, torch.Tensor] | None = None
        self._handle: Any = None
        self._generator: torch.Generator | None = None

    def _capture(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not module.training:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            self._inputs = {"input_ids": ids, "attention_mask": kwargs.get("attention_mask")}

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module = None, **kwargs: Any) -> None:
        if model is not None and self._handle is None:
            self._handle = model.register_forward_pre_hook(self._capture, with_kwargs=True)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          model: torch.nn.Module = None, optimizer: Any = None,
                          **kwargs: Any) -> None:
        opt = innermost_optimizer(optimizer)
        if not isinstance(opt, SophiaG) or model is None:
            return
        # Trainer increments global_step after this event: the step that just ran is global_step + 1
        if (state.global_step + 1) % opt.gnb_update_period != 0:
            return
        if self._inputs is None:
            raise RuntimeError("SophiaGHessianCallback saw no training batch: was it added before training began?")
        ids = self._inputs["input_ids"]
        if self._generator is None or self._generator.device != ids.device:
            self._generator = torch.Generator(device=ids.device)
            self._generator.manual_seed(args.seed if self.seed is None else self.seed)
        from hf_optbench.models import tokens_per_step

        tokens = tokens_per_step(args, ids.shape[-1])
        dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
        gnb_hessian_update(model, opt, ids, tokens_per_step=tokens, attention_mask=self._inputs["attention_mask"],
                           generator=self._generator, autocast_dtype=dtype)
