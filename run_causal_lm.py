"""Entry point of the causal_lm task: `python run_causal_lm.py --help` (bert_ipu/tasks/causal_lm/ says what it does)."""
from bert_ipu.cli import run

if __name__ == "__main__":
    run("causal_lm", __file__)
