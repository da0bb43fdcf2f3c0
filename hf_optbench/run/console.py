"""What a run prints while it trains: a progress line now and then, not transformers' dict per logged step."""

from __future__ import annotations


class ConsoleProgress:
    """A line every ~10% of the run and at each evaluation, instead of transformers' dict per logged step
    (logging_steps=1 would otherwise print every step)."""

    def __new__(cls, max_steps: int):  # built lazily: transformers is imported inside functions only
        from transformers import TrainerCallback

        class _ConsoleProgress(TrainerCallback):
            def __init__(self) -> None:
                self.every = max(1, max_steps // 10)

            def on_log(self, args, state, control, logs=None, **kwargs):
                if not state.is_world_process_zero or not logs:
                    return
                if "eval_loss" in logs:
                    print(f"[step {state.global_step}/{state.max_steps}] eval_loss {logs['eval_loss']:.4f}",
                          flush=True)
                elif "loss" in logs and (state.global_step % self.every == 0 or state.global_step == 1):
                    grad = logs.get("grad_norm")
                    grad_s = f" grad_norm {grad:.3g}" if isinstance(grad, (int, float)) else ""
                    print(f"[step {state.global_step}/{state.max_steps}] loss {logs['loss']:.4f} "
                          f"lr {logs.get('learning_rate', 0):.3g}{grad_s}", flush=True)

        return _ConsoleProgress()
