"""Evidence for step 05's choice: bf16 autocast (fp32 master weights) vs pure bf16 weights.

Trains step 04's model (fp32, the step before bf16) three ways for N steps on the same batches:
fp32, autocast bf16, and pure bf16 (model cast to bf16, as the reference ladder's step 05 does),
and prints the final loss, the fraction of AdamW updates that pure bf16 weights round away, and
the bytes of weights + grads + optimizer state. CPU is enough (slow where bf16 is emulated).

    python tools/bf16_evidence.py [--steps 200] [--data PATH]   # default text: Middlemarch
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from speed_ladder.files import ROOT  # noqa: E402
from speed_ladder.flags import positive  # noqa: E402
from speed_ladder.measure.data import load_split  # noqa: E402
from speed_ladder.presets import GPT2_VOCAB, PRESETS  # noqa: E402


def state_bytes(model, opt):
    tensors = [*model.parameters(), *(q.grad for q in model.parameters() if q.grad is not None)]
    tensors += [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors if t.dim())


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=positive, default=200, help="training steps per mode")
    ap.add_argument(
        "--data", metavar="PATH", help="training text (default: the steps' data/middlemarch.txt)"
    )
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("s04", ROOT / "steps" / "04_pinned_memory.py")
    s04 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s04)
    p = PRESETS["tiny"]
    keys = ["context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias"]
    cfg = {"vocab_size": GPT2_VOCAB, **{k: p[k] for k in keys}}
    train, _ = load_split(a.data, p["context_length"], p["batch_size"], 1)
    loader = s04.create_dataloader(
        train, p["batch_size"], p["context_length"], True, True, 123, workers=0, pin_memory=False
    )
    print(
        f"tiny model, {a.steps} steps, lr {p['lr']}, batch {p['batch_size']}x{p['context_length']}"
    )
    for mode in ["fp32", "autocast-bf16", "pure-bf16"]:
        torch.manual_seed(123)
        model = s04.GPTModel(cfg)
        if mode == "pure-bf16":
            model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], weight_decay=p["weight_decay"])
        step, lost, seen, losses = 0, 0, 0, []
        while step < a.steps:
            for x, y in loader:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast-bf16"):
                    loss = s04.calc_loss_batch(x, y, model)
                opt.zero_grad()
                loss.backward()
                before = [q.detach().clone() for q in model.parameters()]
                opt.step()
                if mode == "pure-bf16":  # updates AdamW computed but bf16 could not represent
                    for b, q in zip(before, model.parameters(), strict=True):
                        lost += int((b == q.detach()).sum())
                        seen += b.numel()
                losses.append(loss.item())
                step += 1
                if step == a.steps:
                    break
        tail = losses[-20:]
        extra = f", updates rounded away: {lost / seen:.1%}" if seen else ""
        print(
            f"{mode:>14}: mean loss of the last {len(tail)} steps {sum(tail) / len(tail):.3f}, "
            f"weights+grads+AdamW state {state_bytes(model, opt) / 2**20:.0f} MiB{extra}"
        )


if __name__ == "__main__":
    main()
