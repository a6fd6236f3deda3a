"""Entry point of the pretraining task: `python run_pretraining.py --help` (bert_ipu/tasks/pretraining/ says what it does)."""
from bert_ipu.cli import run

if __name__ == "__main__":
    run("pretraining", __file__)
