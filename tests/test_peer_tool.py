"""tools/peer.py: the peer of the speed check, made from a fetched copy of Raschka's
01_opt_single_gpu.py, which stays outside the repository. Here a stand-in with the same anchors
(the places the tool changes) and a tiny model, so the changed script really runs on a CPU."""

import subprocess
import sys

import pytest
from conftest import BPE, ROOT, run_script

TOOL = ROOT / "tools" / "peer.py"

# the anchors as rasbt/LLMs-from-scratch ch05/10 has them (28c65cd), around a model that trains
STAND_IN = """import os
import time

import matplotlib.pyplot as plt
import torch
import tiktoken


def calc_loss_batch(inp, tgt, model, device):
    return torch.nn.functional.mse_loss(model(inp), tgt)


def plot_losses(*a):
    raise SystemExit("the plot is drawn")


def train_model_simple_with_timing(**kw):
    raise SystemExit("the original training ran")


def main(gpt_config, settings):
    torch.manual_seed(123)
    device = torch.device("cpu")
    file_path = "middlemarch.txt"
    with open(file_path, "r", encoding="utf-8") as file:
        text_data = file.read()
    here = os.path.dirname(os.path.abspath(__file__))
    assert os.environ["TIKTOKEN_CACHE_DIR"] == os.path.join(here, "tiktoken")
    model = torch.nn.Linear(4, 4)
    model.to(device).to(torch.bfloat16)
    print("CONFIG", gpt_config["context_length"], gpt_config["emb_dim"], settings["batch_size"],
          gpt_config["drop_rate"])
    print("DTYPE", next(model.parameters()).dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(3, 4), torch.randn(3, 4)) for _ in range(7)]  # 7 batches an epoch
    train_loader = [(x.to(next(model.parameters()).dtype), y.to(next(model.parameters()).dtype))
                    for x, y in data]
    tokenizer = None

    train_losses, val_losses, tokens_seen = train_model_simple_with_timing(
        model=model,
        train_loader=train_loader,
        tokenizer=tokenizer
    )

    return train_losses, val_losses, tokens_seen, model


if __name__ == "__main__":

    GPT_CONFIG_124M = {
        "vocab_size": 50304,     # Vocabulary size
        "context_length": 1024,  # Input tokens per training example
        "emb_dim": 768,          # Embedding dimension
        "n_heads": 12,           # Number of attention heads
        "n_layers": 12,          # Number of layers
        "drop_rate": 0.1,        # Dropout rate
        "qkv_bias": False        # Query-key-value bias
    }

    OTHER_SETTINGS = {
        "learning_rate": 5e-4,
        "num_epochs": 15,
        "batch_size": 32,
        "weight_decay": 0.1
    }

    train_losses, val_losses, tokens_seen, model = main(GPT_CONFIG_124M, OTHER_SETTINGS)

    epochs_tensor = torch.linspace(0, OTHER_SETTINGS["num_epochs"], len(train_losses))
    plot_losses(epochs_tensor, tokens_seen, train_losses, val_losses)
    plt.savefig("loss.pdf")
"""


def make(tmp_path, *args, src=STAND_IN):
    (tmp_path / "src.py").write_text(src)
    out = tmp_path / "data" / "peer"
    cmd = [sys.executable, TOOL, tmp_path / "src.py", "--out", out, "--bpe", BPE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60), out


def run_peer(out):
    """The changed peer, run from its folder: no tiktoken cache set."""
    cmd = [sys.executable, out / "01_opt_single_gpu.py"]
    return run_script(cmd, cwd=out, env={"TIKTOKEN_CACHE_DIR": None}, timeout=120)


def test_the_peer_trains_its_steps_and_prints_their_median(tmp_path):
    proc, out = make(tmp_path, "--steps", "15")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (out / "tiktoken").iterdir()) == sorted(
        ["6d1cbeee0f20b3d9449abfede4726ed8212e3aee", "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"]
    )  # tiktoken's cache names of vocab.bpe and encoder.json
    (out.parent / "middlemarch.txt").write_text("text")  # ../middlemarch.txt from the peer's folder
    run = run_peer(out)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert (
        "CONFIG 1024 768 32 0.1" in lines and "DTYPE torch.bfloat16" in lines
    )  # the GPU peer as is
    (peer,) = [ln for ln in lines if ln.startswith("PEER median step ")]
    assert peer.endswith("steps 11-15") and " tok/s " in peer  # 15 steps over 3 epochs of 7


@pytest.mark.parametrize(
    "extra, dropout",
    [([], "0.1"), (["--no-dropout"], "0.0")],  # the cpu preset's model; step 16's (no dropout)
    ids=["preset", "no-dropout"],
)
def test_the_cpu_peer_is_the_cpu_presets_model_in_fp32(tmp_path, extra, dropout):
    proc, out = make(tmp_path, "--steps", "11", "--preset", "cpu", "--fp32", *extra)
    assert proc.returncode == 0, proc.stderr
    (out.parent / "middlemarch.txt").write_text("text")
    run = run_peer(out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"CONFIG 256 384 4 {dropout}" in run.stdout and "DTYPE torch.float32" in run.stdout


def test_another_peer_or_bad_input_is_one_error_line(tmp_path):
    moved = STAND_IN.replace('    file_path = "middlemarch.txt"\n', '    file_path = "x.txt"\n')
    for args, src, says in (
        ([], moved, "not the peer this tool knows: 'file_path = \"middlemarch.txt\"' found 0x"),
        (["--steps", "10"], STAND_IN, "--steps 10: the median is over the steps after the first"),
    ):
        proc, out = make(tmp_path, *args, src=src)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.startswith("error: ") and says in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not (out / "01_opt_single_gpu.py").exists()
